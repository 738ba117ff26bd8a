# Seconds each long test took in a Release run here (ctest's CTestCostData.txt,
# rounded; regenerate with tests/costs.sh after a full `ctest -j2`). CTest starts
# the costliest tests first when it has this and no cost data of its own yet --
# on a fresh clone (CI) it would otherwise start them in declaration order and
# finish with one long test running alone. Only the order depends on it.
set(DL_COST_fuzz_envelope 9)
set(DL_COST_test_barrier 10)
set(DL_COST_test_blas_select_cli 11)
set(DL_COST_test_chaos 76)
set(DL_COST_test_conserve 20)
set(DL_COST_test_crashloop 19)
set(DL_COST_test_export 14)
set(DL_COST_test_hetero 9)
set(DL_COST_test_hostile 20)
set(DL_COST_test_k8s_validate 15)
set(DL_COST_test_learner_trust 18)
set(DL_COST_test_load 17)
set(DL_COST_test_metrics 33)
set(DL_COST_test_prometheus 21)
set(DL_COST_test_py_failures 10)
set(DL_COST_test_py_interop 11)
set(DL_COST_test_refusals 8)
set(DL_COST_test_sim_cli 19)
set(DL_COST_test_sim_crosscheck 78)
set(DL_COST_test_slurm 79)
set(DL_COST_test_store 11)
set(DL_COST_test_straggler 20)
set(DL_COST_test_swarm 16)
set(DL_COST_test_wa 13)
