"""``monarch-ft drill`` from a checkout: ``python recipes/drill.py [OVERRIDES]`` (see monarch_ft/recipes/drill.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from monarch_ft.recipes.drill import main  # noqa: E402

if __name__ == "__main__":
    main()
