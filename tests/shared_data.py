"""Where the shared public datasets are: ``../shared/data/smartnoise`` next to the repository.

In a git worktree at ``/work/wt/<name>`` the repository's parent is ``/work/wt``, so the
folder one level further up is tried as well. Tests skip with a clear reason when neither
exists (never copy the data into the repository).
"""

from __future__ import annotations

from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]


def smartnoise_dir() -> Path:
    """The first existing ``<ancestor>/shared/data/smartnoise`` (the repository's parent, then its
    grandparent); if neither exists, the first (so that ``.exists()`` checks skip)."""
    candidates = [_REPO.parent / "shared" / "data" / "smartnoise",
                  _REPO.parent.parent / "shared" / "data" / "smartnoise"]
    return next((c for c in candidates if c.exists()), candidates[0])
