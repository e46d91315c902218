/* `bash` in the e2e busybox image: busybox's POSIX shell under bash's name, for NVIDIA's specs
 * that run `bash -c "ls ...; trap 'exit 0' TERM; sleep 9999 & wait"` (POSIX sh as well), so
 * they run with only their image swapped. Not a bash: nothing bash-only works. */
#include <unistd.h>

int main(int argc, char **argv) {
    (void)argc;
    argv[0] = "sh";
    execv("/bin/sh", argv);
    return 127;
}
