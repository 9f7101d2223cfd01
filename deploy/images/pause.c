/*
 * nodelet pause: the process that holds a pod sandbox's namespaces.
 *
 * Built statically (gcc -static -Os -s) by scripts/runtime-up.sh into the image
 * localhost/nodelet/pause:3.9. Behaviour:
 *   - sleeps forever (pause(2) in a loop),
 *   - reaps every child that exits (it is PID 1 of the pod's PID namespace when
 *     the pod shares one), so no zombies accumulate,
 *   - exits 0 on SIGTERM or SIGINT,
 *   - "pause -v" prints a version string and exits 0.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NODELET_PAUSE_VERSION "nodelet-pause 3.9"

static void on_term(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_chld(int sig)
{
	int saved = errno;

	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
	errno = saved;
}

int main(int argc, char **argv)
{
	struct sigaction sa;

	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts(NODELET_PAUSE_VERSION);
		return 0;
	}
	if (getpid() != 1)
		fprintf(stderr, "warning: pause should be the first process\n");

	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_term;
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0)
		return 1;

	sa.sa_handler = on_chld;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	if (sigaction(SIGCHLD, &sa, NULL) < 0)
		return 2;

	for (;;)
		pause();
	return 42; /* not reached */
}
