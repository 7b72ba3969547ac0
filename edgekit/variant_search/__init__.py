"""Pick the shipping variant by measuring on the device: candidates over runtimes, formats and INT8
encodings, cheap host-side filters first, racing on the device with early stopping, then selection
under the accuracy tolerance and the memory budget."""

from .run import SearchOptions, search

__all__ = ["SearchOptions", "search"]
