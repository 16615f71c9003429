"""The resnet50-db command: create, inspect, dump and bench an image database."""
