"""The run marker's typed shape (``RUN_DIR/ablate_run.json``): what :class:`ablate.service.records.reader.RunReader` checks before any
command reads a run, so that valid JSON of the wrong shape is refused in one line instead of read as a run."""

from __future__ import annotations

from typing import Any

__all__ = ["marker_problem"]


def _marker_model():
    """The typed shape of a run marker (every key optional but ``grid``, as older markers lack some), strict: a
    marker of the right keys and the wrong types is not one ablate wrote."""
    from typing import Literal

    from pydantic import ConfigDict, Field, create_model

    some = dict[str, Any]
    return create_model(
        "RunMarker",
        __config__=ConfigDict(strict=True, extra="allow"),
        grid=(str, ...),
        grids=(dict[str, some], {}),
        scale=(str | None, None),
        preset=(str | None, None),
        grid_file=(str | None, None),
        grid_yaml=(str | None, None),
        search=(Literal["grid", "optuna"], "grid"),
        axes=(list[str], []),
        variants=(list[str], []),
        n_trials=(int | None, Field(None, ge=0)),
        created=(str | None, None),
        ablate_version=(str | None, None),
        pack=(int, Field(1, ge=1)),
        points=(dict[str, some], {}),
        runs=(list[some], []),
    )


def marker_problem(info: dict[str, Any]) -> str | None:
    """What is wrong with a run marker's types, in one line (a ``points`` entry that is a number, ``runs`` a
    string: status, resume and export would read it as a run), or None when it has the shape ablate writes."""
    from pydantic import ValidationError

    from ablate.messages import describe_validation

    model = _marker_model()
    try:
        model.model_validate(info)
    except ValidationError as exc:
        return describe_validation(exc, model.model_fields)
    return None
