"""The accuracy-aware INT8 pass (``quantize_accuracy_aware``; ``quantize.py`` documents its rungs), one role a
module, imported one way: ``config`` <- ``ladder`` <- ``qat`` <- ``quantize``. No module reads another's private
names. The pass registry (``passes/registry.py``) names ``accuracy_aware.quantize:AccuracyAwareQuantize``."""
