import pytest

from core import config as cfg_lib
from experiments.configs import lm as lm_config


def test_variants_and_overrides():
    tiny = lm_config.get_config("tiny")
    paper = lm_config.get_config("paper")
    assert tiny.variant == "tiny" and paper.variant == "paper"
    assert paper.model.d_model == 768 and tiny.model.d_model == 128
    c = lm_config.get_config("tiny,steps=7,model.d_model=64,data_path=a.txt")
    assert c.steps == 7 and c.model.d_model == 64 and c.data_path == "a.txt"


def test_default_is_tiny():
    assert lm_config.get_config(None).variant == "tiny"


@pytest.mark.parametrize("arg, match", [
    ("huge", "unknown config variant 'huge'"),
    ("tiy", r"unknown config variant 'tiy' \(did you mean 'tiny'\?\)"),
    ("tiny,stepz=3", r"no field 'stepz' \(did you mean 'steps'\?\)"),
    ("tiny,steps", "expected key=value"),
    ("tiny,model.qqqq=3", "no field 'model.qqqq'; fields of 'model': attention, attention_block, "
                          "d_model, "),
    ("tiny,model.num_layer=3", r"no field 'model.num_layer' \(did you mean 'model.num_layers'"),
    ("tiny,steps.x=3", "no field 'steps.x'; 'steps' is a single value"),
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


def test_check_field_and_field_paths():
    c = lm_config.get_config("tiny")
    paths = cfg_lib.field_paths(c)
    assert "model" in paths and "model.d_model" in paths and "steps" in paths
    assert all(p.split(".")[0] in c for p in paths)
    cfg_lib.check_field(c, "model.d_model")  # exists: no error
    with pytest.raises(ValueError, match=r"no field 'modle.d_model' \(did you mean 'model.d_model'"):
        cfg_lib.check_field(c, "modle.d_model")
    # an unrelated name gets the fields of the top level instead of a guess
    with pytest.raises(ValueError, match="no field 'zzzzqqq'; fields: .*steps"):
        cfg_lib.check_field(c, "zzzzqqq")
