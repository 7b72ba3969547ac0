"""Task metrics, scored on the host from the outputs the device returns.

The agent stays stdlib + runtime: it sends back every output of the eval pass, and the host scores
them here. One small contract (:class:`Metric` in ``base.py``), built-in metrics one family per
module, a registry by name (``registry.py``; user metrics are ``module:function`` or
``path.py:function``), and paired statistics between two variants (``paired.py``).
"""

from ..inputs.metric_spec import MetricSpec
from .base import Metric, MetricError, Score
from .registry import get_metric, known_metrics, resolve_metric

__all__ = ["Metric", "MetricError", "MetricSpec", "Score", "get_metric", "known_metrics", "resolve_metric"]
