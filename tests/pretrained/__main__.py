"""``python -m tests.pretrained``: fetch every pretrained model into the cache (.ci/install.sh runs it)."""

from . import MODELS, model_file

for name in MODELS:
    print(name, model_file(name))
