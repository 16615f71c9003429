"""ResNet-50 trainer for LMDB/LevelDB image databases, the heir of Caffe2's resnet50_trainer.py."""

__version__ = "0.1.0"
