"""Which tier each test is in (README "Tests"): the markers `make test-fast` selects by.

- unit: pure functions, files and configuration; no solver iterations worth the name.
- numeric: float64 references in this process (solver against serial, autograd, finite
  differences, fixed points), a second or less each.
- training: whole training runs in this process (app.run, train()).
- cli: starts another interpreter (the `lptrain` command, or Python in a subprocess).
- mpi: launches mpiexec.

tests/cli and tests/mpi are cli and mpi by their files' `pytestmark`. A file of tests/unit
is in the tier FILES gives it, a test in the tier EXCEPTIONS gives it (by function name);
a file missing from FILES counts as training, so that it is kept out of `make test-fast`
until someone says what it is. `slow` (full parameter products, minutes-long trainings) is
marked in the files and is orthogonal to the tiers.
"""
from __future__ import annotations

TIERS = ("unit", "numeric", "training", "cli", "mpi")

# The files whose cases run in one shared `mpiexec -n 4` launch (tests/mpi/conftest.py,
# by their FOUR_RANKS): pytest-xdist runs them on one worker (tests/conftest.py).
SHARED_LAUNCH = {"tests/mpi/test_ranks.py", "tests/mpi/test_module_ranks.py",
                 "tests/mpi/test_grid_ranks.py", "tests/mpi/test_ddp_ranks.py"}

FILES = {
    "test_builtin_steps.py": "numeric",
    "test_checkpoint_formats.py": "training",
    "test_cli_task.py": "training",
    "test_help_format.py": "unit",
    "test_inert_settings.py": "training",
    "test_collective.py": "unit",
    "test_coarse_steps.py": "numeric",
    "test_compact_warm.py": "numeric",
    "test_config_compose.py": "unit",
    "test_config_refusals.py": "unit",
    "test_config_source.py": "unit",
    "test_config_sweeps.py": "unit",
    "test_context.py": "unit",
    "test_dir_values.py": "unit",
    "test_control_estimate.py": "unit",
    "test_control_plans.py": "unit",
    "test_control_runs.py": "unit",
    "test_conv_modes.py": "numeric",
    "test_conv_ops.py": "numeric",
    "test_custom_step.py": "numeric",
    "test_custom_step_app.py": "numeric",
    "test_data_indian_pines.py": "unit",
    "test_data_mnist.py": "unit",
    "test_data_split.py": "unit",
    "test_dataset_contract.py": "unit",
    "test_data_record.py": "unit",
    "test_mgrit_shortfall.py": "training",
    "test_data_groups.py": "numeric",
    "test_ddp_groups.py": "unit",
    "test_eval_preprocessing.py": "unit",
    "test_exchange.py": "unit",
    "test_fault_matrix.py": "unit",
    "test_grid_split.py": "unit",
    "test_grid_times.py": "unit",
    "test_record_glue.py": "numeric",
    "test_guard.py": "unit",
    "test_loop_clock.py": "training",
    "test_hierarchy.py": "unit",
    "test_host_sharing.py": "numeric",
    "test_indexing.py": "unit",
    "test_jobs.py": "unit",
    "test_level_ops.py": "numeric",
    "test_lp_torch_modes.py": "training",
    "test_lp_module_autograd.py": "numeric",
    "test_lp_module_checks.py": "numeric",
    "test_lp_module_halo.py": "numeric",
    "test_lp_module_layers.py": "numeric",
    "test_lp_module_state.py": "numeric",
    "test_lp_module_training.py": "numeric",
    "test_matfile.py": "unit",
    "test_zip_entry.py": "unit",
    "test_stored_pairs.py": "training",
    "test_memory.py": "unit",
    "test_metrics_columns.py": "unit",
    "test_metrics_console_format.py": "unit",
    "test_metrics_console_progress.py": "unit",
    "test_metrics_console_streams.py": "unit",
    "test_metrics_schema.py": "unit",
    "test_metrics_writer.py": "unit",
    "test_mgrit_fusions.py": "numeric",
    "test_mgrit_protocols.py": "numeric",
    "test_mgrit_solve.py": "numeric",
    "test_neighbours.py": "cli",
    "test_model_summary.py": "unit",
    "test_optimizer_cost.py": "unit",
    "test_optimizer_state.py": "numeric",
    "test_model.py": "numeric",
    "test_module.py": "numeric",
    "test_module_copies.py": "numeric",
    "test_tied_layers.py": "unit",
    "test_module_steps.py": "numeric",
    "test_optimizers.py": "numeric",
    "test_readme.py": "unit",
    "test_reference.py": "unit",
    "test_regrid.py": "numeric",
    "test_report_baseline.py": "unit",
    "test_report_cli.py": "unit",
    "test_report_plots.py": "unit",
    "test_report_runs.py": "unit",
    "test_report_table.py": "unit",
    "test_report_timing.py": "unit",
    "test_resume_checkpoint.py": "training",
    "test_resume_runs.py": "training",
    "test_run_state.py": "unit",
    "test_run_files.py": "unit",
    "test_sweeps.py": "unit",
    "test_runplan.py": "unit",
    "test_saved_model.py": "training",
    "test_same_input.py": "unit",
    "test_schedules.py": "unit",
    "test_simultaneous.py": "training",
    "test_speedup_auto.py": "numeric",
    "test_speedup_command.py": "numeric",
    "test_speedup_model.py": "numeric",
    "test_stall.py": "unit",
    "test_step_count.py": "numeric",
    "test_tensorboard.py": "training",
    "test_tiers.py": "unit",
    "test_warm_down.py": "numeric",
    "test_warm_start.py": "numeric",
}

EXCEPTIONS = {
    # trainings inside files of pure or numeric tests
    "test_compact_warm.py": {
        "test_one_shot_mini_batch_training_is_unchanged_by_compact_warm_starts": "training"},
    "test_control_estimate.py": {
        "test_the_estimate_bounds_the_true_gradient_error": "numeric",
        "test_a_calibrated_run_records_the_true_error_and_scales_its_estimate": "training",
        "test_the_exact_modes_estimate_round_off": "training"},
    "test_control_runs.py": {
        "test_one_shot_keeps_up_with_serial_on_large_layer_steps": "training",
        "test_one_shot_keeps_up_with_serial_where_lbfgs_amplifies_errors": "training",
        "test_a_tighter_target_plans_more_iterations": "training",
        "test_mini_batches_share_a_warm_plan_and_a_cold_plan": "training"},
    "test_memory.py": {"test_the_estimate_is_the_measured_peak": "training"},
    "test_eval_preprocessing.py": {
        "test_lptrain_eval_of_a_peaks_run_says_which_validation_points_it_trained_on":
            "training"},
    "test_readme.py": {"test_readme_python_example_runs": "training"},
    "test_custom_step_app.py": {
        "test_serial_and_converged_mgrit_train_alike": "training",
        "test_modes_and_optimizers_run_and_resume": "training",
        "test_saved_model_rebuilds_the_users_module_and_scores_like_the_run": "training",
        "test_a_saved_custom_model_fine_tunes_with_the_training_gradient": "training",
        "test_resume_refuses_another_step": "training"},
    "test_lp_module_training.py": {
        "test_one_shot_training_with_warm_starts_reaches_serial_quality": "training",
        "test_the_readme_example_trains": "training"},
    # pure tests inside files of trainings
    "test_resume_checkpoint.py": {
        "test_automatic_interval_keeps_checkpoints_under_two_percent": "unit",
        "test_ranks_agree_on_the_automatic_interval_whatever_their_clocks": "unit"},
    "test_tensorboard.py": {"test_unknown_logger_is_refused": "unit"},
    # another interpreter
    "test_metrics_console_streams.py": {
        "test_output_through_a_pipe_is_plain_text": "cli",
        "test_a_line_under_an_mpi_launcher_in_a_terminal_is_broken_at_its_width": "cli"},
    "test_metrics_writer.py": {"test_rows_survive_sigkill": "cli"},
    "test_report_cli.py": {"test_corrupt_file_exits_2_without_traceback": "cli"},
    "test_run_files.py": {
        "test_default_directories_never_collide": "cli",
        "test_a_file_that_cannot_be_written_ends_in_one_line_without_a_crash": "cli",
        "test_lock_names_its_owner_and_takes_over_a_stale_one": "cli",
        "test_lock_of_a_live_lptrain_process_on_this_host_is_honoured": "cli",
        "test_a_file_another_process_writes_is_refused": "cli"},
}


def tier_of(file_name: str, function: str, marked: set[str]) -> str | None:
    """The tier of a tests/unit test that no tier marker of its own names; None if one
    does (its marker wins)."""
    if marked & set(TIERS):
        return None
    return EXCEPTIONS.get(file_name, {}).get(function, FILES.get(file_name, "training"))
