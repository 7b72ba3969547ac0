"""Hardware classes (``targets/*.yaml``): data only, validated on load.

A target says what a kind of device is and can run; a *device* (host, port, serial, ...) is an
instance of a target and lives in the user's inventory, never here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..config import load_model_file
from ..errors import TargetError
from ..formats import RUNTIME_FOR_FORMAT, spec_for_runtime

RuntimeName = str  # one of the format registry's runtimes (edgekit.formats.FORMATS), checked below
EnergySource = Literal["rapl", "hwmon", "android_battery", "external_command"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MeasureDefaults(_Strict):
    """Measurement settings. Defaults follow the TFLite benchmark tool and Olive: a fixed warmup,
    then runs until both ``runs`` and ``min_seconds`` are met (capped by ``max_runs``)."""

    warmup: int = Field(10, ge=0, description="untimed runs before measuring")
    runs: int = Field(50, ge=1, description="minimum timed runs")
    min_seconds: float = Field(1.0, ge=0, description="minimum total timed seconds")
    max_runs: int = Field(5000, ge=1, description="hard cap on timed runs")
    threads: int = Field(1, ge=1, description="intra-op threads of the runtime")


class Limits(_Strict):
    """Budgets a variant must meet on this hardware class (None = no budget)."""

    # budget for the device-measured p50, ms: the gate's latency_ms_p50 where the recipe sets none
    # (--latency-budget-ms wins)
    latency_ms_p50: float | None = Field(None, gt=0)
    # budget for the device-measured p90, ms: the gate's latency_ms_p90 where the recipe sets none
    latency_ms_p90: float | None = Field(None, gt=0)
    # budget for the agent process's peak RSS while measuring, MB: the gate's peak_memory_mb where the recipe sets
    # none (--memory-budget-mb wins)
    peak_memory_mb: float | None = Field(None, gt=0)
    # budget for the variant's file size, MB of 10^6 bytes: the gate's model_size_mb where the recipe sets none
    model_size_mb: float | None = Field(None, gt=0)


class RuntimeWheels(_Strict):
    """The extra wheels one runtime needs on the device, provisioned only when asked for
    (``edgekit devices provision NAME --runtime R``, ``sim up --runtime R``)."""

    packages: tuple[str, ...] = Field((), description="installed with their dependencies, like `packages`")
    no_deps: tuple[str, ...] = Field((), description="exact pins downloaded and installed without their declared "
                                     "dependencies (pip evaluates a wheel's markers against this host, not the "
                                     "device: torch's nvidia-* requirements would follow onto an aarch64 device)")
    host_built: tuple[str, ...] = Field((), description="exact pins of wheels edgekit builds on this host for the "
                                        "device instead of downloading them (`llama-cpp-python==0.3.36`: the "
                                        "binding with llama.cpp cross-compiled for the target's `march`), "
                                        "installed without their declared dependencies")


class WheelSpec(_Strict):
    """Wheels the device runtime needs, for offline provisioning from a host-side wheelhouse."""

    # the device's Python (X.Y) the wheels are downloaded for (pip download --python-version); `edgekit devices
    # check` flags a device whose Python is another version
    python_version: str = "3.11"
    # pip platform tags to download for (one --platform each, e.g. manylinux_2_28_aarch64); empty: pip's default,
    # this host's platform
    platforms: tuple[str, ...] = ()
    # requirements downloaded with their dependencies on the host and installed on the device by `edgekit devices
    # provision` (pip itself rides along)
    packages: tuple[str, ...] = ()
    runtime_packages: dict[str, RuntimeWheels] = Field(default_factory=dict, description="per runtime (a name in "
                                                       "`runtimes`), the wheels it adds on top of `packages`")


class BrowserProfile(_Strict):
    """How the browser target's page is made to look like a phone's (``browser-mobile``): Chromium's own
    DevTools emulation. A throttled CPU is an emulation: its latency is not a real phone's and is not gated."""

    cpu_throttle: float = Field(1.0, ge=1, le=20, description="CPU slowdown factor (DevTools "
                                "Emulation.setCPUThrottlingRate; Lighthouse's mid-tier phone is 4)")
    viewport: tuple[int, int] | None = Field(None, description="CSS pixels (width, height) of the emulated screen")
    # device pixels per CSS pixel of the emulated screen (DevTools Emulation.setDeviceMetricsOverride); applied
    # only with a viewport
    device_scale_factor: float = Field(1.0, gt=0)
    mobile: bool = False  # emulate a mobile device (setDeviceMetricsOverride's mobile flag); only with a viewport

    @property
    def emulated(self) -> bool:
        return self.cpu_throttle > 1

    def describe(self) -> str:
        screen = f", a {self.viewport[0]}x{self.viewport[1]} {'mobile ' if self.mobile else ''}viewport" \
            if self.viewport else ""
        return f"Chromium CPU throttling x{self.cpu_throttle:g} (DevTools Emulation.setCPUThrottlingRate){screen}"


MICRO_RUNTIMES = ("tflite-micro",)  # runtimes of a microcontroller target (edgekit/micro/), not format-registry rows


class Microcontroller(_Strict):
    """A microcontroller part (``microcontroller:`` of a target whose transport is ``host-interpreter``): what
    the model must fit. No board is attached: TFLite Micro's own kernels run on this host (edgekit/micro/), so fit,
    op support and accuracy are the part's, and its latency is not measured."""

    # the Arm Cortex-M core class (the latency estimate's cycles per MAC are fitted per class)
    core: Literal["cortex-m0plus", "cortex-m3", "cortex-m4", "cortex-m4f", "cortex-m7", "cortex-m33", "cortex-m55",
                  "cortex-m85"]
    clock_mhz: float = Field(gt=0, description="the core's clock, MHz")
    sram_kb: float = Field(gt=0, description="on-chip SRAM, KiB: the tensor arena and the application share it")
    flash_kb: float = Field(gt=0, description="on-chip flash, KiB: the model's bytes and the code")
    # the fraction of SRAM and of flash kept free for the application (its stack, buffers and code): the model
    # fits when arena <= sram * (1 - fit_margin) and model + interpreter <= flash * (1 - fit_margin)
    fit_margin: float = Field(0.1, ge=0, lt=1)
    # the interpreter's own flash, KiB (nothing here builds TFLM for the part)
    interpreter_flash_kb: float = Field(16, ge=0)
    # where the interpreter's flash figure comes from (the report's fit section carries it: micro.fit)
    interpreter_flash_source: str = ("TFLite Micro README (github.com/tensorflow/tflite-micro): 'The core runtime "
                                     "just fits in 16 KB on an Arm Cortex M3'; the op kernels the model uses add "
                                     "to it and are not counted, so this flash figure is a lower bound")


class TargetSpec(_Strict):
    name: str  # the target's name: its file's stem (targets/NAME.yaml, checked on load); inventory devices name it
    description: str = ""  # one line on the hardware class, shown by `edgekit targets list`
    # the device's CPU architecture (wasm32: a browser page); `edgekit devices check` flags a device whose agent
    # reports another, and the report records it (device.target_arch)
    arch: Literal["x86_64", "aarch64", "armv7l", "arm64", "wasm32", "armv6-m", "armv7-m", "armv7e-m", "armv8-m.main",
                  "armv8.1-m.main"]
    # the device's operating system (browser: a web page); `edgekit devices check` flags a device whose agent
    # reports another
    os: Literal["linux", "android", "ios", "macos", "browser", "none"]  # none: bare metal (a microcontroller)
    # the device's CPU cores: thread tuning (the search, a language model's deploy) tries up to this many, at most
    # 4 (MAX_THREADS) and no more than the agent finds usable
    cores: int = Field(ge=1)
    # the device's memory, MB: a language model's weights, KV cache and runtime must fit 80% of it (a
    # microcontroller's is its SRAM, filled in from `microcontroller.sram_kb` when not given)
    memory_mb: int | float = Field(gt=0)
    runtimes: tuple[RuntimeName, ...] = Field(min_length=1, description="in order of preference")
    march: str | None = Field(None, description="the GCC -march of the device's cores, for native code edgekit "
                              "cross-builds on the host (llama.cpp); e.g. armv8.2-a+dotprod+fp16 (Cortex-A76)")

    @field_validator("runtimes")
    @classmethod
    def _known_runtimes(cls, v):
        known = sorted(set(RUNTIME_FOR_FORMAT.values()) | set(MICRO_RUNTIMES))
        bad = [r for r in v if r not in known]
        if bad:
            raise ValueError(f"unknown runtime(s) {bad}; known: {known}")
        return v
    # browser: this host's headless Chromium; host-interpreter: no device, the runtime's interpreter runs on this host
    # in a child process (a microcontroller's TFLite Micro)
    transport: Literal["local", "ssh", "adb", "browser", "host-interpreter"]
    # the Python command that runs the agent on an ssh or adb device (an inventory entry's own python wins)
    python: str = "python3"
    # the energy sensors to try on the device, in order: the agent reads the first that works; empty: no energy
    # figure (--energy-command adds external_command)
    energy_sources: tuple[EnergySource, ...] = ()
    measure: MeasureDefaults = MeasureDefaults()  # measurement settings; a recipe's measure and the command line win
    limits: Limits = Limits()  # budgets on this hardware class; a recipe's gate sets its own instead
    # the wheels `edgekit devices provision` downloads on the host and installs on the device (which needs no
    # internet); None: nothing to provision
    wheels: WheelSpec | None = None
    big_cores_mask: str | None = None  # taskset mask of the fast cores (big.LITTLE SoCs)
    browser: BrowserProfile | None = None  # transport browser only: the page's emulated phone, if any
    # search candidates this target adds to the default deploy's short search (the registry marks the
    # likeliest winners on a typical CPU; a board where another runtime is known to win names its candidates)
    short_search: tuple[str, ...] = ()
    notes: str = ""  # free text for people (e.g. how the board throttles); edgekit reads nothing from it
    microcontroller: Microcontroller | None = None  # a microcontroller part: SRAM, flash, core, clock, fit margin

    @model_validator(mode="before")
    @classmethod
    def _memory_from_sram(cls, data: Any) -> Any:
        mcu = data.get("microcontroller") if isinstance(data, dict) else None
        if isinstance(mcu, dict) and "memory_mb" not in data and isinstance(mcu.get("sram_kb"), (int, float)):
            return {**data, "memory_mb": mcu["sram_kb"] / 1024}
        return data

    @model_validator(mode="after")
    def _microcontroller_is_one_kind(self) -> TargetSpec:
        micro = [r for r in self.runtimes if r in MICRO_RUNTIMES]
        parts = {"microcontroller": self.microcontroller is not None, "transport host-interpreter":
                 self.transport == "host-interpreter", f"runtimes {list(MICRO_RUNTIMES)}": bool(micro)}
        if any(parts.values()) and not all(parts.values()):
            missing = [k for k, v in parts.items() if not v]
            raise ValueError(f"a microcontroller target needs `microcontroller:` (sram_kb, flash_kb, core, clock_mhz), "
                             f"transport host-interpreter and runtimes [tflite-micro] together; missing: {missing}")
        if micro and len(self.runtimes) != len(micro):
            raise ValueError(f"a microcontroller target runs only {list(MICRO_RUNTIMES)}, not {list(self.runtimes)}")
        return self

    @property
    def is_microcontroller(self) -> bool:
        return self.microcontroller is not None

    @model_validator(mode="after")
    def _short_search_names_candidates_of_its_runtimes(self):
        known = [c.name for r in self.runtimes if (row := spec_for_runtime(r)) is not None
                 for c in row.search_candidates]
        bad = [n for n in self.short_search if n not in known]
        if bad:
            raise ValueError(f"short_search names {bad}, which are not search candidates of this target's runtimes "
                             f"{list(self.runtimes)}; known: {known}")
        return self

    @model_validator(mode="after")
    def _browser_profile_for_browser_only(self):
        if self.browser is not None and self.transport != "browser":
            raise ValueError(f"`browser:` (an emulated page) needs transport browser, not {self.transport}")
        return self

    @model_validator(mode="after")
    def _runtime_wheels_for_listed_runtimes(self):
        extra = sorted(set(self.wheels.runtime_packages) - set(self.runtimes)) if self.wheels else []
        if extra:
            raise ValueError(f"wheels.runtime_packages names runtime(s) {extra} that `runtimes` does not list")
        return self


def targets_dirs() -> list[Path]:
    """Where target files are looked up, first match wins: $EDGEKIT_TARGETS_PATH (os.pathsep-
    separated), the source tree's targets/, then the copy shipped inside the wheel."""
    dirs: list[Path] = []
    env = os.environ.get("EDGEKIT_TARGETS_PATH")
    if env:
        dirs += [Path(p) for p in env.split(os.pathsep) if p]
    src = Path(__file__).resolve().parents[2] / "targets"
    if src.is_dir():
        dirs.append(src)
    # the wheel's copy, edgekit/_targets: a folder without __init__.py (a namespace package), for which
    # importlib.resources.files() returns a MultiplexedPath whose str() is its repr, not a path
    shipped = Path(__file__).resolve().parents[1] / "_targets"
    if shipped.is_dir() and shipped not in dirs:
        dirs.append(shipped)
    return dirs


def list_targets() -> list[str]:
    names: dict[str, None] = {}
    for d in targets_dirs():
        for f in sorted(d.glob("*.yaml")):
            names.setdefault(f.stem, None)
    return sorted(names)


def load_target(name_or_path: str | Path) -> TargetSpec:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return load_model_file(TargetSpec, p, hint="see targets/local.yaml for a valid example")
    for d in targets_dirs():
        f = d / f"{name_or_path}.yaml"
        if f.is_file():
            spec = load_model_file(TargetSpec, f, hint="see targets/local.yaml for a valid example")
            if spec.name != f.stem:
                raise TargetError(f"{f}: name '{spec.name}' does not match the file name '{f.stem}'")
            return spec
    known = ", ".join(list_targets()) or "(none found)"
    raise TargetError(
        f"unknown target '{name_or_path}'",
        hint=f"known targets: {known}; or pass a path to a target .yaml file (`edgekit targets list`)",
    )
