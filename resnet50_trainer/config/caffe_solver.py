"""Caffe's SolverParameter (caffe.proto), read from a solver.prototxt in protobuf's text format.

The descriptor is written here field by field from caffe.proto, as data/formats/protos.py writes
Datum's, so every field Caffe knows parses and can be named: solver.py honours it, notes it, or
refuses it. A net given inline (net_param and the like) is a NetParameter, left without fields
here: it is refused by name, since this trainer builds ResNet from --num_layers.
"""

from __future__ import annotations

import os
import stat

from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from google.protobuf.message import Message

from resnet50_trainer.data.formats.protos import add_field, message_class
from resnet50_trainer.errors import UserError

_Field = descriptor_pb2.FieldDescriptorProto
# A solver file is a few hundred bytes; anything this large is not one.
MAX_SOLVER_BYTES = 1 << 20
# (name, number, type, repeated, enum type or message type, default): caffe.proto's order.
_FIELDS = (
    ("net", 24, _Field.TYPE_STRING, False, "", ""),
    ("net_param", 25, _Field.TYPE_MESSAGE, False, ".caffe.NetParameter", ""),
    ("train_net", 1, _Field.TYPE_STRING, False, "", ""),
    ("test_net", 2, _Field.TYPE_STRING, True, "", ""),
    ("train_net_param", 21, _Field.TYPE_MESSAGE, False, ".caffe.NetParameter", ""),
    ("test_net_param", 22, _Field.TYPE_MESSAGE, True, ".caffe.NetParameter", ""),
    ("train_state", 26, _Field.TYPE_MESSAGE, False, ".caffe.NetState", ""),
    ("test_state", 27, _Field.TYPE_MESSAGE, True, ".caffe.NetState", ""),
    ("test_iter", 3, _Field.TYPE_INT32, True, "", ""),
    ("test_interval", 4, _Field.TYPE_INT32, False, "", "0"),
    ("test_compute_loss", 19, _Field.TYPE_BOOL, False, "", "false"),
    ("test_initialization", 32, _Field.TYPE_BOOL, False, "", "true"),
    ("base_lr", 5, _Field.TYPE_FLOAT, False, "", ""),
    ("display", 6, _Field.TYPE_INT32, False, "", ""),
    ("average_loss", 33, _Field.TYPE_INT32, False, "", "1"),
    ("max_iter", 7, _Field.TYPE_INT32, False, "", ""),
    ("iter_size", 36, _Field.TYPE_INT32, False, "", "1"),
    ("lr_policy", 8, _Field.TYPE_STRING, False, "", ""),
    ("gamma", 9, _Field.TYPE_FLOAT, False, "", ""),
    ("power", 10, _Field.TYPE_FLOAT, False, "", ""),
    ("momentum", 11, _Field.TYPE_FLOAT, False, "", ""),
    ("weight_decay", 12, _Field.TYPE_FLOAT, False, "", ""),
    ("regularization_type", 29, _Field.TYPE_STRING, False, "", "L2"),
    ("stepsize", 13, _Field.TYPE_INT32, False, "", ""),
    ("stepvalue", 34, _Field.TYPE_INT32, True, "", ""),
    ("clip_gradients", 35, _Field.TYPE_FLOAT, False, "", "-1"),
    ("snapshot", 14, _Field.TYPE_INT32, False, "", "0"),
    ("snapshot_prefix", 15, _Field.TYPE_STRING, False, "", ""),
    ("snapshot_diff", 16, _Field.TYPE_BOOL, False, "", "false"),
    ("snapshot_format", 37, _Field.TYPE_ENUM, False, "SnapshotFormat", "BINARYPROTO"),
    ("solver_mode", 17, _Field.TYPE_ENUM, False, "SolverMode", "GPU"),
    ("device_id", 18, _Field.TYPE_INT32, False, "", "0"),
    ("random_seed", 20, _Field.TYPE_INT64, False, "", "-1"),
    ("type", 40, _Field.TYPE_STRING, False, "", "SGD"),
    ("delta", 31, _Field.TYPE_FLOAT, False, "", "1e-08"),
    ("momentum2", 39, _Field.TYPE_FLOAT, False, "", "0.999"),
    ("rms_decay", 38, _Field.TYPE_FLOAT, False, "", "0.99"),
    ("debug_info", 23, _Field.TYPE_BOOL, False, "", "false"),
    ("snapshot_after_train", 28, _Field.TYPE_BOOL, False, "", "true"),
    ("solver_type", 30, _Field.TYPE_ENUM, False, "SolverType", "SGD"),
    ("layer_wise_reduce", 41, _Field.TYPE_BOOL, False, "", "true"),
    ("weights", 42, _Field.TYPE_STRING, True, "", ""),
)
_ENUMS = {
    "SnapshotFormat": ("HDF5", "BINARYPROTO"),
    "SolverMode": ("CPU", "GPU"),
    "SolverType": ("SGD", "NESTEROV", "ADAGRAD", "RMSPROP", "ADADELTA", "ADAM"),
}
_INLINE_NETS = ("caffe.NetParameter", "caffe.NetState")
_INLINE_FIELDS = ("net_param", "train_net_param", "test_net_param", "train_state", "test_state")
_INLINE_FIX = (
    "a net or net state written inline, which this trainer cannot honour: it builds ResNet from "
    "--num_layers; remove net_param, train_net_param, test_net_param, train_state and test_state"
)


def _solver_file() -> descriptor_pb2.FileDescriptorProto:
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="resnet50_trainer/caffe_solver.proto", package="caffe", syntax="proto2"
    )
    for name in ("NetParameter", "NetState"):
        file_proto.message_type.add(name=name)
    solver = file_proto.message_type.add(name="SolverParameter")
    for enum_name, values in _ENUMS.items():
        enum = solver.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    for name, number, field_type, repeated, type_name, default in _FIELDS:
        if field_type == _Field.TYPE_ENUM:
            type_name = f".caffe.SolverParameter.{type_name}"
        add_field(solver, name, number, field_type, repeated, False, type_name, default)
    return file_proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_solver_file())
SolverParameter = message_class(_POOL, "caffe.SolverParameter")


def read_solver(path: str) -> Message:
    """The SolverParameter in `path`; UserError naming the file and what is wrong with it."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise UserError(
            f"--solver {path}: {error.strerror}: give the path of a Caffe solver.prototxt"
        ) from None
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SOLVER_BYTES:
        raise UserError(
            f"--solver {path} is not a solver file (not a regular file of at most "
            f"{MAX_SOLVER_BYTES} bytes): give the path of a Caffe solver.prototxt"
        )
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(MAX_SOLVER_BYTES + 1)
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"--solver {path} cannot be read ({error}): check the file") from None
    solver = SolverParameter()
    try:
        text_format.Parse(text, solver)
    except text_format.ParseError as error:
        raise UserError(f"--solver {path}: {_parse_problem(str(error))}") from None
    inline = [field.name for field, _ in solver.ListFields() if field.name in _INLINE_FIELDS]
    if inline:  # written empty, as `net_param {}`: parsed, but still not a ResNet of ours
        raise UserError(f"--solver {path}: {inline[0]}: {_INLINE_FIX}")
    return solver


def _parse_problem(error: str) -> str:
    """The parser's complaint, and the fix."""
    if any(name in error for name in _INLINE_NETS):
        return f"{error} — {_INLINE_FIX}"
    return f"{error} — not Caffe SolverParameter text (caffe.proto): fix or remove that line"
