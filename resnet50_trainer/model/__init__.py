"""What trains: the ResNet, its replica on this process's devices, the optimizer, the learning
rate schedule, precision, the weights' EMA."""
