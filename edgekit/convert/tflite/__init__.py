"""The ONNX -> TFLite hop's parts, by role; ``convert/onnx_to_tflite.py`` runs them in order. ``config`` (the hop's
options), ``onnx2tf_offline`` (onnx2tf run in its own folder, never reaching the network), ``host_harness`` (a
.tflite run on this host exactly as the device runs it; ``litert_probe`` is its child-process check),
``layout`` (which TFLite tensor is which ONNX tensor, in which layout), ``int8_converter`` (TensorFlow's INT8
converter from onnx2tf's SavedModel). Nothing here is imported by this ``__init__``."""
