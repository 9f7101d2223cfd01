//! `nodelet exec` and `nodelet attach`: a command run in a container (`/exec`), or the container's main
//! process (`/attach`), on the local nodelet's main port; the session itself is [`super::session`]'s.
//! The command's exit code is returned for the process to exit with.

use super::session::{self, Kind, Target};
use super::stream::{MainPort, StreamError};
use crate::args::{AttachArgs, ExecArgs};

/// Runs `nodelet exec`; returns the command's exit code.
pub(crate) async fn run(args: &ExecArgs) -> Result<i32, StreamError> {
    let main = MainPort::new(&args.server)?;
    let container =
        session::container_or_default(&args.server, &args.namespace, &args.pod, args.container.as_deref())
            .await?;
    let target = Target {
        kind: Kind::Exec,
        namespace: &args.namespace,
        pod: &args.pod,
        container: &container,
        command: &args.command,
        stdin: args.stdin,
        tty: args.tty,
    };
    session::interactive(&main, &target).await
}

/// Runs `nodelet attach`; returns the exit code the session ended with (0 when the runtime sends none).
pub(crate) async fn attach(args: &AttachArgs) -> Result<i32, StreamError> {
    let main = MainPort::new(&args.server)?;
    let container =
        session::container_or_default(&args.server, &args.namespace, &args.pod, args.container.as_deref())
            .await?;
    let target = Target {
        kind: Kind::Attach,
        namespace: &args.namespace,
        pod: &args.pod,
        container: &container,
        command: &[],
        stdin: args.stdin,
        tty: args.tty,
    };
    session::interactive(&main, &target).await
}
