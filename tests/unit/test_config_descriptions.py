"""Every field of the study config has a description, and the config reference prints it.

The models are walked as docs/hooks/reference.py walks them for reference/config.md (its
``config_sections``), so a section the page shows cannot go undescribed, and one added to the
config (a new backend's config class, a new workload section) is walked without a change here."""

from __future__ import annotations


from pydantic import BaseModel, Field

from prefixstudy.engines import config_classes
from tests.scripts import load_script



def _hook():
    return load_script("docs/hooks/reference.py")


hook = _hook()


def undescribed(sections: list[tuple[str, type[BaseModel]]]) -> list[str]:
    """The dotted keys of the fields whose description is missing or blank."""
    return [f"{prefix}{name} ({model.__name__})" for prefix, model in sections
            for name, field in model.model_fields.items() if not (field.description or "").strip()]


def test_the_walk_reaches_every_config_model():
    names = {m.__name__ for _, m in hook.config_sections()}
    assert {c.__name__ for c in config_classes().values()} <= names
    assert {"StudyConfig", "DatasetConfig", "ArrivalConfig", "SweepConfig", "CheckConfig", "RayConfig", "RouterConfig",
            "ArmConfig", "OffloadConfig", "MixConfig", "SessionsConfig", "TraceConfig", "LengthDist",
            "SloSearchConfig", "CapacitySearchConfig", "EngineWarmupConfig"} <= names
    assert len(names) == 22  # the 16 above and the six engine kinds


def test_every_config_field_has_a_description():
    assert undescribed(hook.config_sections()) == []


def test_a_field_without_one_is_named():
    class Inner(BaseModel):
        size_gib: float = Field(1.0, description="GiB")
        seed: int = 0

    assert undescribed([("", Inner), ("outer.", Inner)]) == ["seed (Inner)", "outer.seed (Inner)"]


def test_the_config_page_prints_every_description_in_its_field_s_row():
    page = hook.config_page()
    for prefix, model in hook.config_sections():
        table = hook.model_table(model, prefix)
        assert "\n".join(table) in page  # the section as it is on the page (engine kinds share a prefix)
        for name, field in model.model_fields.items():
            row = next(line for line in table if line.startswith(f"| `{prefix}{name}` |"))
            assert row.endswith(f"| {hook._cell(field.description)} |"), row


def test_a_description_with_a_pipe_stays_in_its_cell():
    assert hook._cell("a | b\n   c") == "a \\| b c"
