"""``monarch-ft goodput-bench`` from a checkout: ``python recipes/goodput_bench.py [OVERRIDES]`` (see monarch_ft/recipes/goodput_bench.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from monarch_ft.recipes.goodput_bench import main  # noqa: E402

if __name__ == "__main__":
    main()
