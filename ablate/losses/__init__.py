"""``from ablate.losses import ContrastiveLoss``: the losses and their interface (:mod:`ablate.core.losses`), under the
name a plugin imports. A plugin loss subclasses :class:`ContrastiveLoss` and implements ``forward(h1, h2)``."""

from ablate.core.losses import *  # noqa: F403 - this module is that package's public name
from ablate.core.losses import __all__  # noqa: F401
