"""The TFLite builtin ops the installed TFLite Micro has kernels for, read from the wheel itself.

The ``tflite-micro`` wheel's Python interpreter resolves ops with a ``MicroMutableOpResolver`` that registers every
kernel the build holds, and exposes no list of them. Each kernel is registered through a
``tflite::micro::Register_<OP>()`` function, so the list is read from those symbols in the wheel's ``_runtime.so``
(the names that are TFLite builtin operators; custom ops such as the signal library's are left out): the
interpreter that judges the model and the list that screens it are the same build.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from ..errors import MissingExtraError

_REGISTER = re.compile(rb"_ZN6tflite5micro\d+Register_([A-Z0-9_]+)Ev")  # tflite::micro::Register_OP()
SOURCE = "Register_<OP> symbols of the installed tflite-micro wheel's _runtime.so (its op resolver's kernels)"


def _package_dir() -> Path:
    try:
        import tflite_micro  # heavy: numpy and the TFLM extension
    except ImportError as exc:
        raise MissingExtraError("tflite-micro", "micro", "a microcontroller target (TFLite Micro's interpreter)") \
            from exc
    return Path(tflite_micro.__file__).resolve().parent


def tflm_version() -> str:
    """The installed tflite-micro's version (its build's git hash included)."""
    import tflite_micro  # heavy: the TFLM extension

    return str(tflite_micro.__version__)


def builtin_names() -> dict[int, str]:
    """TFLite builtin operator code -> name, from the schema the wheel ships."""
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema  # heavy: flatbuffers

    return {v: k for k, v in vars(schema.BuiltinOperator).items() if k.isupper() and isinstance(v, int)}


@functools.lru_cache(maxsize=1)
def tflm_kernels() -> frozenset[str]:
    """The builtin ops (TFLite names, e.g. CONV_2D) the installed TFLM has a kernel for."""
    so = next((_package_dir() / "python" / "tflite_micro").glob("_runtime*.so"), None)
    if so is None:
        raise MissingExtraError("tflite-micro", "micro", "a microcontroller target (its _runtime extension is missing)")
    registered = {m.group(1).decode() for m in _REGISTER.finditer(so.read_bytes())}
    return frozenset(registered & set(builtin_names().values()))
