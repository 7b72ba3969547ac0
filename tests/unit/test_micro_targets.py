"""Microcontroller targets (issue #44 item 1): SRAM, flash, core, clock and fit margin in the target file, validated
on load with errors that name the key, and listed by `edgekit targets list`."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from edgekit.cli.main import app
from edgekit.errors import ConfigError
from edgekit.inputs.targets import load_target

NRF = {"name": "nrf", "arch": "armv7e-m", "os": "none", "cores": 1, "runtimes": ["tflite-micro"],
       "transport": "host-interpreter",
       "microcontroller": {"core": "cortex-m4f", "clock_mhz": 64, "sram_kb": 256, "flash_kb": 1024}}


def _write(tmp_path, doc):
    p = tmp_path / "nrf.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize(("name", "core", "sram_kb", "flash_kb"), [
    ("nrf52840", "cortex-m4f", 256, 1024), ("stm32h7", "cortex-m7", 512, 2048),
    ("cortex-m55", "cortex-m55", 1024, 4096)])
def test_the_shipped_microcontrollers_load(name, core, sram_kb, flash_kb):
    spec = load_target(name)
    assert spec.is_microcontroller and spec.microcontroller is not None
    assert (spec.microcontroller.core, spec.microcontroller.sram_kb, spec.microcontroller.flash_kb) == (core, sram_kb,
                                                                                                      flash_kb)
    assert spec.memory_mb == sram_kb / 1024  # filled in from the SRAM: the part's memory is its SRAM
    assert 0 < spec.microcontroller.fit_margin < 1 and spec.microcontroller.clock_mhz > 0


def test_targets_list_shows_them():
    res = CliRunner().invoke(app, ["targets", "list", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert {"nrf52840", "stm32h7", "cortex-m55"} <= set(rows)
    assert rows["nrf52840"]["microcontroller"]["sram_kb"] == 256 and rows["rpi4"]["microcontroller"] is None


@pytest.mark.parametrize(("change", "says"), [
    ({"transport": "local"}, "transport host-interpreter"),
    ({"runtimes": ["tflite-micro", "litert"]}, "runs only ['tflite-micro']"),
    ({"microcontroller": None, "memory_mb": 1}, "missing: ['microcontroller']"),
    ({"microcontroller": {**NRF["microcontroller"], "sram_kb": 0}}, "microcontroller.sram_kb"),
    ({"microcontroller": {**NRF["microcontroller"], "core": "cortex-m9"}}, "microcontroller.core: must be one of"),
    ({"microcontroller": {**NRF["microcontroller"], "fit_margin": 1.5}}, "microcontroller.fit_margin"),
])
def test_a_bad_microcontroller_target_is_refused_by_name(tmp_path, change, says):
    doc = {k: v for k, v in {**NRF, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        load_target(_write(tmp_path, doc))
    assert says in str(e.value)


def test_a_custom_part_loads_from_a_path(tmp_path):
    spec = load_target(_write(tmp_path, {**NRF, "microcontroller": {**NRF["microcontroller"], "fit_margin": 0.25}}))
    assert spec.microcontroller is not None and spec.microcontroller.fit_margin == 0.25
