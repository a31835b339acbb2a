"""Where a sweep's runs train: Slurm through submitit (`slurm`), subprocesses here (`local`), this process
(`debug`); the sbatch scripts (`render`) and the job's entry point (`entry`)."""
