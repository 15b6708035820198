"""The builder protocol's promises to an outside agent project (magi_lp.agent.builder)."""

from __future__ import annotations

import importlib

from magi_lp.agent.builder import AgentBuilder


def test_a_builder_still_overriding_validate_config_gets_one_warning_naming_the_entry_point(
    capsys,
):
    class OldBuilder(AgentBuilder):
        @classmethod
        def validate_config(cls, config):
            raise AssertionError("never called by the toolkit")

    class ItsSubclass(OldBuilder):  # inherits the override: no second warning
        pass

    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("[magi_lp.builder ")
    assert f"warning: {__name__}." in lines[0]
    assert ".OldBuilder.validate_config is never called" in lines[0]
    assert "distributed_main(make_experiment, validate_config=...)" in lines[0]
    assert "single_process_main(make_experiment, validate_config=...)" in lines[0]
    assert ItsSubclass.__mro__[1] is OldBuilder


def test_the_projects_builders_get_no_warning(capsys):
    for module in ("projects.drq_v2.builder", "projects.td3.builder"):
        importlib.import_module(module)

    class NewBuilder(AgentBuilder):
        pass

    assert capsys.readouterr().err == ""
    builders = AgentBuilder.__subclasses__()
    assert {"DrQBuilder", "TD3Builder"} <= {b.__name__ for b in builders}
    assert not any("validate_config" in vars(b) for b in builders if b.__module__ != __name__)
