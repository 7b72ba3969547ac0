"""``python -m tests.pretrained``: fetch every pretrained model (and the face model's LFW photos) into the cache."""

from . import LFW, MODELS, _member, model_file

for name in MODELS:
    print(name, model_file(name))
print("face data", _member("face", *LFW))
