"""torchft's Lighthouse server without importing torch: ``python _lighthouse_server.py ARGS``.

torchft's ``torchft_lighthouse`` script imports the torchft package, i.e. torch: 10-30 s
on a loaded machine, which is how long every Manager would wait for a restarted
Lighthouse. This loads only the extension (``MONARCH_FT_TORCHFT_SO``, found by
monarch_ft.controller.lighthouse) and runs its ``lighthouse_main``, which parses the process's own
arguments after this script's path, as it does after the script's: so this file is run
by path, with the Lighthouse's arguments only.
"""

import importlib.util
import os
import sys

if __name__ == "__main__":
    spec = importlib.util.spec_from_file_location("torchft._torchft", os.environ["MONARCH_FT_TORCHFT_SO"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.exit(module.lighthouse_main())
