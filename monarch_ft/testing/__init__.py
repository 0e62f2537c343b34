"""What the tests (and a user trying a launcher) need around real jobs: a local single-node
Slurm cluster (:mod:`.slurm_cluster`) and the job-test helpers (:mod:`.jobs`); and, for the fast
tests, a fake clock and a fake launcher that drive the real watch loop (:mod:`.fakes`).

On top of the layers (above the command line, which its helpers drive): nothing of monarch_ft imports it.
"""
