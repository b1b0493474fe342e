/* The load-tester benchmark's trivial HTTP/1.1 server: one thread, epoll, keep-alive, a canned
 * answer to every request (a request ends at a blank line; requests carry no body). In C so that
 * the server is not what limits the clients compared against it (wrk, locust, gpulens).
 *
 *   cc -O2 -o trivial_server trivial_server.c && ./trivial_server PORT
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>
#include <arpa/inet.h>

static const char RESP[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok";
#define RESP_LEN (sizeof(RESP) - 1)
#define MAX_FDS 65536

/* Per connection: how far into "\r\n\r\n" the bytes read so far have matched. */
static unsigned char matched[MAX_FDS];

static void nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PORT\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1024)) {
        perror("bind/listen");
        return 1;
    }
    nonblocking(ls);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[256];
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    static char buf[65536], out[RESP_LEN * 512];
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int c;
                while ((c = accept(ls, NULL, NULL)) >= 0) {
                    if (c >= MAX_FDS) { close(c); continue; }
                    nonblocking(c);
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    matched[c] = 0;
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf);
            if (r <= 0) {
                if (r < 0 && errno == EAGAIN) continue;
                close(fd);
                continue;
            }
            int requests = 0;
            unsigned char m = matched[fd];
            for (ssize_t k = 0; k < r; k++) {
                char want = (m & 1) ? '\n' : '\r';
                if (buf[k] == want) {
                    if (++m == 4) { requests++; m = 0; }
                } else {
                    m = buf[k] == '\r' ? 1 : 0;
                }
            }
            matched[fd] = m;
            while (requests > 0) { /* pipelined requests: one write for up to 512 answers */
                int batch = requests < 512 ? requests : 512;
                for (int b = 0; b < batch; b++) memcpy(out + b * RESP_LEN, RESP, RESP_LEN);
                if (write(fd, out, batch * RESP_LEN) < 0) break; /* a full socket buffer: clients wait per answer */
                requests -= batch;
            }
        }
    }
}
