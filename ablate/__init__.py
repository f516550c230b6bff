"""ablate: Ray Tune service for identifiability ablations of contrastive learning (InfoNCE, AnInfoNCE)."""

__version__ = "0.1.0"
