"""The process group and its peers: devices, the NCCL/Gloo transport, the meeting
(rendezvous/), heartbeats, stopping together, gradient compression."""
