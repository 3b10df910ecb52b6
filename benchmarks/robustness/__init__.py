"""Bad and damaged input: what `matgptq` says (bad_input); kills at instants and at file-system steps, fuzzing at
volume, and the checksums' price (faults, faults_kill)."""
