"""Bytes to images and labels: the databases (LMDB, LevelDB), the record formats (Caffe Datum,
Caffe2 TensorProtos), their protos, the keys, the label scan."""
