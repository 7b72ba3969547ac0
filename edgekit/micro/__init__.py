"""Microcontrollers (issue #44): TFLite Micro's kernels, run on this host, decide whether a full-integer INT8 model
fits a part's SRAM and flash, whether every op has a kernel, and what its outputs are. One technique a module:
``kernels`` (the ops the installed TFLM has kernels for), ``onnx_ops`` (the ONNX graph checked against them before
any conversion), ``tflite_graph`` (a .tflite's ops, tensors and the activations' peak), ``interpreter`` (the TFLM
interpreter in a child process: the smallest arena, the eval set), ``fit`` (the verdict against the part),
``c_array`` (the firmware's aligned C array) and ``ship_files`` (what the firmware needs in ship/)."""
