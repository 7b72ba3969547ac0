"""``python -m tests.zoo [NAME ...]``: build (or find in the cache) the zoo models and print where."""

import sys

from . import NAMES, get

for name in sys.argv[1:] or NAMES:
    m = get(name)
    print(f"{name}: {m.facts['metric']}={m.facts['metric_fp32']:.3f} "
          f"train {m.facts['train_steps']} steps {m.facts['train_seconds']} s  {m.dir}", flush=True)
