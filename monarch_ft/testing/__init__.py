"""What the tests (and a user trying a launcher) need around real jobs: a local single-node
Slurm cluster (:mod:`.slurm_cluster`) and the job-test helpers (:mod:`.jobs`).

On top of the layers, like the command line: nothing of monarch_ft imports it.
"""
