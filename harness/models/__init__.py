"""Models with random weights, built from configs: each builder takes a size, `tiny` for
tests and CPUs, a real model's shape for GPUs (`bench.gpu`). None is downloaded."""
