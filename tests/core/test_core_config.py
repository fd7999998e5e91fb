import pytest

from core import config as cfg_lib
from experiments.configs import lm as lm_config


def test_variants_and_overrides():
    tiny = lm_config.get_config("tiny")
    paper = lm_config.get_config("paper")
    assert tiny.variant == "tiny" and paper.variant == "paper"
    assert paper.model.d_model == 768 and tiny.model.d_model == 128
    c = lm_config.get_config("tiny,steps=7,model.d_model=64,corpus=a.txt")
    assert c.steps == 7 and c.model.d_model == 64 and c.corpus == "a.txt"


def test_default_is_tiny():
    assert lm_config.get_config(None).variant == "tiny"


@pytest.mark.parametrize("arg, match", [
    ("huge", "unknown config variant 'huge'"),
    ("tiny,stepz=3", "no field 'stepz'"),
    ("tiny,steps", "expected key=value"),
    ("tiny,model.width=3", "no field 'model.width'"),
])
def test_bad_config_raises(arg, match):
    with pytest.raises(ValueError, match=match):
        lm_config.get_config(arg)


def test_locked_config_rejects_new_fields():
    c = lm_config.get_config("tiny")
    with pytest.raises(AttributeError):
        c.not_a_field = 1


def test_parse_arg_literals():
    assert cfg_lib.parse_arg("paper,a=1,b=0.5,c=x,d=True,e=(1, 2),f=[3,4]") == (
        "paper", {"a": 1, "b": 0.5, "c": "x", "d": True, "e": (1, 2), "f": [3, 4]})
