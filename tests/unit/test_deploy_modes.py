"""Which variants `deploy` measures: a recipe's, the short search's (no recipe), or every candidate (--search)."""

import pytest

from edgekit.errors import BadInputError
from edgekit.inputs.recipe import Recipe
from edgekit.inputs.targets import load_target
from edgekit.orchestration.options import DeployOptions
from edgekit.pipeline.deploy import variant_mode

LOCAL = load_target("local")


def test_no_recipe_is_the_short_search_and_the_flags_choose_otherwise():
    opts = DeployOptions(train_data="train.npz")  # the search takes it: the ladder's QAT rung
    assert variant_mode(None, None, opts, LOCAL, True) == "quick"
    assert variant_mode(None, True, opts, LOCAL, True) == "full"
    assert variant_mode(None, False, opts, LOCAL, True) == "recipe"
    assert variant_mode(Recipe(), None, opts, LOCAL, True) == "recipe"
    assert opts.extra_warnings == []  # chosen by the user: nothing to explain


def test_search_with_a_recipe_is_refused():
    with pytest.raises(BadInputError, match="does not take --recipe"):
        variant_mode(Recipe(), True, DeployOptions(), LOCAL, True)


@pytest.mark.parametrize("field,value,words", [
    ("pool", "local:lab", "--pool (it measures on one device"),
    ("devices", ["a", "b"], "--devices (it measures on one device"),
])
def test_options_only_a_recipe_run_takes_keep_the_fixed_variants_and_say_so(field, value, words):
    opts = DeployOptions(**{field: value})
    assert variant_mode(None, None, opts, LOCAL, True) == "recipe"
    assert len(opts.extra_warnings) == 1 and "no recipe: measured the fixed default variants" in opts.extra_warnings[0]
    assert words in opts.extra_warnings[0]


def test_a_target_the_search_cannot_measure_keeps_the_fixed_variants():
    opts = DeployOptions()
    assert variant_mode(None, None, opts, load_target("iphone-coreml"), True) == "recipe"
    assert "has no runtime the search can measure here (coreml)" in opts.extra_warnings[0]
