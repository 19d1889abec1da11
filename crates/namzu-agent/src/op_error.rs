//! The typed error of one agent operation ([`OpError`], the wire's
//! `AgentError`) and how it becomes a gRPC status. Its own module so the
//! operation modules (exec, files, sessions, terminal, tcp, quiesce) depend
//! on it, not on the service that calls them.

use namzu_proto::v1::{self, agent_error::Kind};
use tonic::Status;

/// The typed error of one operation, as it travels.
pub type OpError = v1::AgentError;

pub fn agent_err(kind: Kind, op: &str, message: &str) -> OpError {
    v1::AgentError {
        kind: kind as i32,
        op: op.into(),
        message: message.into(),
        ..Default::default()
    }
}

pub trait IntoStatus {
    fn into_status(self) -> Status;
}

impl IntoStatus for OpError {
    fn into_status(self) -> Status {
        use tonic::Code;
        let code = match self.kind() {
            Kind::InvalidArgument => Code::InvalidArgument,
            Kind::NotFound | Kind::UnknownExec => Code::NotFound,
            Kind::AlreadyExists => Code::AlreadyExists,
            Kind::PermissionDenied | Kind::PathEscape => Code::PermissionDenied,
            Kind::LimitExceeded | Kind::WalkLimit => Code::ResourceExhausted,
            Kind::Retiring | Kind::ShuttingDown => Code::Unavailable,
            Kind::Io | Kind::Unspecified => Code::Internal,
            Kind::NotADirectory
            | Kind::IsADirectory
            | Kind::NotRegularFile
            | Kind::DirectoryNotEmpty
            | Kind::ExecState
            | Kind::SpawnFailed
            | Kind::Protocol => Code::FailedPrecondition,
            Kind::FeatureDisabled => Code::Unimplemented,
            Kind::ConnectionRefused => Code::Unavailable,
            Kind::Survivor => Code::Aborted,
            Kind::Timeout => Code::DeadlineExceeded,
            Kind::AttachReplaced => Code::Aborted,
            Kind::NotAttachable | Kind::Paused => Code::FailedPrecondition,
        };
        namzu_proto::status_with_error(code, self)
    }
}
