"""Caffe's Datum and Caffe2's TensorProto/TensorProtos message classes, built at run time.

The descriptors are written here field by field from caffe.proto and caffe2/proto/caffe2.proto,
so neither protoc nor generated *_pb2 modules are needed and any protobuf >= 4.21 works.
Fields the trainer never reads (TensorProto.device_detail = 8, segment = 11) are left out:
protobuf keeps them as unknown fields, so records that carry them still parse.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

_Field = descriptor_pb2.FieldDescriptorProto

# caffe2.proto: TensorProto.DataType
DATA_TYPES = {
    "UNDEFINED": 0,
    "FLOAT": 1,
    "INT32": 2,
    "BYTE": 3,
    "STRING": 4,
    "BOOL": 5,
    "UINT8": 6,
    "INT8": 7,
    "UINT16": 8,
    "INT16": 9,
    "INT64": 10,
    "FLOAT16": 12,
    "DOUBLE": 13,
}
FLOAT, INT32, BYTE, STRING, UINT8 = (
    DATA_TYPES[name] for name in ("FLOAT", "INT32", "BYTE", "STRING", "UINT8")
)


def add_field(
    message: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    field_type: int,
    repeated: bool = False,
    packed: bool = False,
    type_name: str = "",
    default: str = "",
) -> None:
    field = message.field.add(
        name=name,
        number=number,
        type=field_type,
        label=_Field.LABEL_REPEATED if repeated else _Field.LABEL_OPTIONAL,
    )
    if packed:
        field.options.packed = True
    if type_name:
        field.type_name = type_name
    if default:
        field.default_value = default


def _caffe_file() -> descriptor_pb2.FileDescriptorProto:
    """caffe.proto: message Datum (proto2; float_data is not packed there)."""
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="resnet50_trainer/caffe.proto", package="caffe", syntax="proto2"
    )
    datum = file_proto.message_type.add(name="Datum")
    add_field(datum, "channels", 1, _Field.TYPE_INT32)
    add_field(datum, "height", 2, _Field.TYPE_INT32)
    add_field(datum, "width", 3, _Field.TYPE_INT32)
    add_field(datum, "data", 4, _Field.TYPE_BYTES)
    add_field(datum, "label", 5, _Field.TYPE_INT32)
    add_field(datum, "float_data", 6, _Field.TYPE_FLOAT, repeated=True)
    add_field(datum, "encoded", 7, _Field.TYPE_BOOL, default="false")
    return file_proto


def _caffe2_file() -> descriptor_pb2.FileDescriptorProto:
    """caffe2.proto: TensorProto (with its DataType enum) and TensorProtos (proto2)."""
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="resnet50_trainer/caffe2.proto", package="caffe2", syntax="proto2"
    )
    tensor = file_proto.message_type.add(name="TensorProto")
    data_type = tensor.enum_type.add(name="DataType")
    for name, number in DATA_TYPES.items():
        data_type.value.add(name=name, number=number)
    add_field(tensor, "dims", 1, _Field.TYPE_INT64, repeated=True)
    add_field(
        tensor,
        "data_type",
        2,
        _Field.TYPE_ENUM,
        type_name=".caffe2.TensorProto.DataType",
        default="FLOAT",
    )
    add_field(tensor, "float_data", 3, _Field.TYPE_FLOAT, repeated=True, packed=True)
    add_field(tensor, "int32_data", 4, _Field.TYPE_INT32, repeated=True, packed=True)
    add_field(tensor, "byte_data", 5, _Field.TYPE_BYTES)
    add_field(tensor, "string_data", 6, _Field.TYPE_BYTES, repeated=True)
    add_field(tensor, "name", 7, _Field.TYPE_STRING)
    add_field(tensor, "double_data", 9, _Field.TYPE_DOUBLE, repeated=True, packed=True)
    add_field(tensor, "int64_data", 10, _Field.TYPE_INT64, repeated=True, packed=True)
    protos = file_proto.message_type.add(name="TensorProtos")
    add_field(
        protos, "protos", 1, _Field.TYPE_MESSAGE, repeated=True, type_name=".caffe2.TensorProto"
    )
    return file_proto


def message_class(pool: descriptor_pool.DescriptorPool, full_name: str) -> type[Message]:
    descriptor = pool.FindMessageTypeByName(full_name)
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)  # protobuf 4.21


# A private pool, so a user's own caffe/caffe2 modules in the default pool never clash with ours.
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_caffe_file())
_POOL.Add(_caffe2_file())

Datum = message_class(_POOL, "caffe.Datum")
TensorProtos = message_class(_POOL, "caffe2.TensorProtos")
