//! The cases. Each states the promise it checks in its doc comment.

use namzu::features as feat;

use crate::{Case, DISK_LIMIT, SNAPSHOT, SUSPEND, SUSPEND_MEMORY};

mod common;
mod detach;
mod exec;
mod files;
mod limits;
mod net;
mod pause;
mod quiesce;
mod sessions;
mod suspend;
mod terminal;
mod watch;
use detach::*;
use exec::*;
use files::*;
use limits::*;
use net::*;
use pause::*;
use quiesce::*;
use sessions::*;
use suspend::*;
use terminal::*;
use watch::*;

macro_rules! register {
    ($( $name:ident [$($need:expr),*] ),* $(,)?) => {
        vec![$( Case { name: stringify!($name), needs: &[$($need),*], run: |f| Box::pin($name(f)) } ),*]
    };
}

pub fn all() -> Vec<Case> {
    register![
        exec_basics[feat::EXEC],
        exit_codes_and_signals[feat::EXEC],
        stdout_stderr_separated_with_offsets[feat::EXEC],
        env_cwd_stdin[feat::EXEC, feat::EXEC_STDIN_STREAM, feat::FILES_MKDIR],
        non_utf8_argv_round_trips[feat::EXEC],
        missing_command_is_spawn_failed[feat::EXEC],
        timeout_kills_the_whole_group[feat::EXEC],
        timeout_above_the_maximum_is_refused[feat::EXEC],
        cancel_kills_the_whole_group[feat::EXEC, feat::EXEC_CANCEL],
        cancel_before_start_never_runs[feat::EXEC, feat::EXEC_CANCEL, feat::FILES_STAT],
        unconfirmed_cancel_retires_the_sandbox[feat::EXEC, feat::EXEC_CANCEL],
        concurrent_execs_do_not_cross_talk[feat::EXEC],
        output_cap_reports_truncation[feat::EXEC],
        write_64mib_round_trips[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_READ_STREAM],
        readers_never_see_a_partial_write[feat::FILES_WRITE, feat::FILES_READ],
        failed_write_leaves_the_old_file[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_LIST],
        oversized_write_is_refused_by_limit[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_LIST],
        abandoned_write_leaves_the_old_file[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_LIST],
        streamed_read_refuses_non_regular_files[feat::FILES_READ_STREAM, feat::FILES_READ, feat::EXEC],
        mode_is_preserved[feat::FILES_WRITE, feat::FILES_STAT, feat::EXEC],
        ranged_reads[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_READ_STREAM],
        streamed_1gib_read_keeps_agent_memory_bounded[feat::FILES_WRITE, feat::FILES_READ_STREAM],
        list_stat_mkdir_remove_rename[feat::FILES_WRITE, feat::FILES_LIST, feat::FILES_STAT, feat::FILES_MKDIR, feat::FILES_REMOVE, feat::FILES_RENAME],
        walk_reports_symlinks_and_honours_limits[feat::FILES_WALK, feat::FILES_WRITE, feat::FILES_MKDIR, feat::EXEC],
        path_escapes_are_refused[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_READ_STREAM, feat::FILES_STAT, feat::FILES_RENAME, feat::FILES_REMOVE, feat::FILES_LIST, feat::EXEC],
        every_op_is_refused_after_destroy[feat::EXEC, feat::FILES_READ],
        tcp_into_the_sandbox_round_trips_with_half_close[feat::TCP_CONNECT, feat::EXEC, feat::FILES_WRITE],
        dropping_an_exec_stream_kills_the_command[feat::EXEC, feat::FILES_READ],
        terminal_runs_resizes_and_close_kills_the_session[feat::TERMINAL, feat::EXEC],
        terminal_login_shell_exit_code[feat::TERMINAL],
        quiesce_stops_everything_but_the_agent[feat::QUIESCE, feat::EXEC, feat::FILES_READ],
        flush_makes_the_workspace_durable[feat::FLUSH, feat::FILES_WRITE],
        pause_stops_every_process_and_resume_continues_them[feat::PAUSE, feat::EXEC, feat::EXEC_ATTACH, feat::FILES_WRITE, feat::FILES_READ],
        suspend_keeps_the_disk_and_resume_starts_it_again[SUSPEND, feat::EXEC, feat::FILES_WRITE, feat::FILES_READ],
        suspend_with_memory_goes_on_where_it_stopped[SUSPEND_MEMORY, feat::EXEC, feat::EXEC_ATTACH],
        forks_of_a_snapshot_go_on_independently[SNAPSHOT, feat::EXEC, feat::EXEC_ATTACH],
        disk_limit_fills_with_enospc[DISK_LIMIT, feat::EXEC, feat::FILES_WRITE, feat::FILES_READ],
        detached_session_output_is_read_by_offset[feat::SESSIONS],
        session_ring_eviction_is_reported_as_dropped_bytes[feat::SESSIONS],
        kill_session_kills_the_whole_session[feat::SESSIONS, feat::EXEC, feat::FILES_READ],
        persistent_terminal_detaches_and_resumes[feat::TERMINAL, feat::SESSIONS],
        detachable_execution_outlives_its_stream_and_resumes_by_offset[feat::EXEC, feat::EXEC_ATTACH, feat::FILES_STAT],
        detachable_execution_refusals_are_typed[feat::EXEC, feat::EXEC_ATTACH, feat::EXEC_CANCEL],
        detachable_execution_cancel_and_retention_limits[feat::EXEC, feat::EXEC_ATTACH, feat::EXEC_CANCEL],
        evicted_execution_output_is_a_gap_and_truncation[feat::EXEC, feat::EXEC_ATTACH],
        cancel_before_start_of_a_detachable_execution_never_runs[feat::EXEC, feat::EXEC_ATTACH, feat::EXEC_CANCEL, feat::FILES_STAT],
        executions_are_listed_with_their_state[feat::EXEC, feat::EXEC_ATTACH, feat::EXEC_LIST],
        exited_execution_records_expire_after_the_ttl[feat::EXEC, feat::EXEC_ATTACH, feat::FILES_STAT],
        named_list_walk_and_session_limits_hold[feat::EXEC, feat::FILES_LIST, feat::FILES_WALK, feat::SESSIONS],
        watch_reports_changes_made_inside[feat::FILES_WATCH, feat::FILES_MKDIR, feat::FILES_WRITE, feat::EXEC],
    ]
}
