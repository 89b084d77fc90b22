"""Every job option walked through the three doors — CLI, HTTP API, library — showing the same
default and the same range, and an error that names the option the way each caller knows it.

The declarations live once in extension/plan/options.py; this test fails if any door drifts from it.
"""

from __future__ import annotations

import pytest

from extension.errors import InvalidOptionError
from extension.plan.options import OPTIONS, Option

from .conftest import TINY_MODEL


def _outside(option: Option) -> list:
    """Values just outside the range on both sides, and a value of the wrong type."""
    if option.choices:
        return ["not-" + option.choices[0], "3", 3]
    if option.kind is str:
        return ["x" * (int(option.maximum) + 1)] + ([""] if option.minimum >= 1 else [])
    below = option.minimum if option.exclusive_minimum else option.minimum - (1 if option.kind is int else 0.001)
    above = option.maximum + (1 if option.kind is int else option.maximum)
    wrong_type = 1.5 if option.kind is int else "fast"
    return [below, above, wrong_type]


def _api_body(option: Option, value) -> dict:
    body = {"base_model": TINY_MODEL, "terms": ["kernel"]}
    field = option.api_name or option.name
    if option.api_group == "root":
        body[field] = value
    else:
        body[option.api_group] = {field: value}
    return body


def _schema_property(schema: dict, option: Option) -> dict:
    field = option.api_name or option.name
    if option.api_group == "root":
        return schema["properties"][field]
    group = schema["$defs"][f"{option.api_group.capitalize()}Options"]
    return group["properties"][field]


def _extend_parser():
    from app.cli import build_parser

    parser = build_parser()
    return next(a for a in parser._subparsers._group_actions).choices["extend"]


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_cli_has_the_option_with_its_default_and_range(option):
    action = next(a for a in _extend_parser()._actions if a.dest == option.name)
    assert action.option_strings == [option.cli_flag]
    assert action.default == option.unset_default and action.type is option.kind
    assert option.valid_range() in action.help and f"(default: {option.default_text})" in action.help


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_library_spec_default_and_range(option):
    from extension.plan.job import validate_spec
    from extension.plan.spec import ExtendSpec

    spec = ExtendSpec(base_model="m", out_dir="o", terms=["kernel"])
    assert getattr(spec, option.name) == option.unset_default
    validate_spec(spec)
    for low_or_high in option.choices or (option.minimum, option.maximum):
        if option.choices:
            value = low_or_high
        elif option.kind is str:
            value = "x" * int(low_or_high)
        elif option.exclusive_minimum and low_or_high == option.minimum:
            continue
        else:
            value = option.kind(low_or_high)
        validate_spec(ExtendSpec(base_model="m", out_dir="o", terms=["kernel"], **{option.name: value}))
    for value in _outside(option):
        with pytest.raises(InvalidOptionError) as caught:
            validate_spec(ExtendSpec(base_model="m", out_dir="o", terms=["kernel"], **{option.name: value}))
        assert caught.value.option == option.name and caught.value.message.startswith(f"{option.name} must be")
        assert option.valid_range() in caught.value.message


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_cli_error_names_the_flag(option, tmp_path, capsys):
    from app.cli import main

    terms = tmp_path / "terms.txt"
    terms.write_text("kernel\n")
    value = _outside(option)[1]
    code = main(["extend", "--base-model", "m", "--terms", str(terms), "--out", str(tmp_path / "out"),
                 option.cli_flag, str(value)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"error ({option.cli_flag}): {option.cli_flag} must be {option.valid_range()}" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_api_schema_and_errors_match(option, client, auth):
    from app.schemas import ExtendRequest

    if option.api_path is None:
        # a server policy, not a request field: the setting's default is the option's
        from app.settings import Settings

        assert Settings.model_fields[option.name].default == option.default
        return
    prop = _schema_property(ExtendRequest.model_json_schema(), option)
    assert prop["default"] == option.unset_default
    if option.device_defaults:  # null, or a value in the range: /docs says what each device makes of null
        assert option.default_text in prop["description"]
        prop = next(p for p in prop["anyOf"] if p.get("type") != "null")
    if option.choices:
        assert prop["enum"] == list(option.choices)
    elif option.kind is str:
        assert (prop["minLength"], prop["maxLength"]) == (option.minimum, option.maximum)
    else:
        low_key = "exclusiveMinimum" if option.exclusive_minimum else "minimum"
        assert (prop[low_key], prop["maximum"]) == (option.minimum, option.maximum)
    for value in _outside(option):
        response = client.post("/extend", json=_api_body(option, value), headers=auth)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == option.api_path and error["code"] == "invalid_option"
        assert error["message"] == f"{option.api_path} must be {option.valid_range()}, got {value!r}"


# Library parameters that mean an option: their defaults must BE the option table's (DEFAULTS[...]),
# not a literal that happens to equal it today.
LIBRARY_DEFAULTS = [
    ("extension/rows/init.py", "apply_rows", "pad_to_multiple_of"),
    ("extension/rows/adapter.py", "attach", "pad_to_multiple_of"),
    ("extension/rows/adapter.py", "RowsAdapter.__init__", "pad_to_multiple_of"),
    ("extension/tokenizer/extend.py", "extend_tokenizer", "max_term_chars"),
    ("extension/tokenizer/terms.py", "clean_terms", "max_term_chars"),
    ("extension/evaluation/metrics.py", "evaluate_model", "eval_max_bytes"),
    ("extension/evaluation/scoring.py", "score_documents", "eval_max_bytes"),
]


@pytest.mark.parametrize("path, function, option", LIBRARY_DEFAULTS)
def test_library_defaults_are_the_option_tables(path, function, option):
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[2] / path).read_text())
    owner, _, function = function.rpartition(".")
    if owner:
        tree = next(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == owner)
    found = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == function]
    assert found, f"{function} not in {path}"
    arguments = found[0].args
    names = [a.arg for a in arguments.args + arguments.kwonlyargs]
    defaults = dict(zip([a.arg for a in arguments.args][-len(arguments.defaults):], arguments.defaults)) if arguments.defaults else {}
    defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None})
    parameter = "max_bytes" if option == "eval_max_bytes" else option
    assert parameter in names
    assert ast.unparse(defaults[parameter]) == f"DEFAULTS['{option}']", ast.unparse(defaults[parameter])


def test_device_options_help_names_every_accepted_value(capsys):
    from app.cli import main
    from extension.plan.device_options import DEVICE_MAP_STRATEGIES, DEVICES, MAP_DEVICES
    from extension.plan.options import BY_NAME

    with pytest.raises(SystemExit):
        main(["extend", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for value in (*DEVICES, *DEVICE_MAP_STRATEGIES, *MAP_DEVICES):
        assert value in help_text and value in BY_NAME["device_map"].help + BY_NAME["device"].help, value
