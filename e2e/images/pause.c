/* The pod sandbox ("pause") process of the e2e real node's local pause image
 * (e2e/images/build.sh). It holds the pod's namespaces: sleeps until SIGTERM or SIGINT and then
 * exits 0, and reaps orphaned children re-parented to it (it is PID 1 of the pod when the pod
 * shares its PID namespace). Built with `gcc -static -Os`, so the image needs no libc. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static void on_chld(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction term = {.sa_handler = on_term};
    struct sigaction chld = {.sa_handler = on_chld, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    sigemptyset(&term.sa_mask);
    sigemptyset(&chld.sa_mask);
    if (sigaction(SIGTERM, &term, NULL) < 0 || sigaction(SIGINT, &term, NULL) < 0 ||
        sigaction(SIGCHLD, &chld, NULL) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
