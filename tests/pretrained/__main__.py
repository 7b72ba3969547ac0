"""``python -m tests.pretrained``: fetch every pretrained model into the cache (.ci/install.sh runs it)."""

from . import NAMES, model_file

for name in NAMES:
    print(name, model_file(name))
