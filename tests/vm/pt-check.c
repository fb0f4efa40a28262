/*
 * pt-check: one end of a one-way perftest bandwidth run (ib_write_bw, ib_read_bw or
 * ib_send_bw: one QP, one size) over libibverbs, speaking perftest's TCP exchange
 * (docs/spec/perftest-oob.md), whose buffers hold a known pattern so the bytes can be
 * checked: perftest fills its buffers with rand() and checks nothing. The other end is
 * `uhca-perf MODE --check` (tools/src/perf/pt_run.rs has the same pattern). Built in the
 * soft-RoCE guest's tree by tests/vm/run-rxe-test.sh.
 *
 *   pt-check write|read|send SIZE ITERS [HOST]     (no HOST: the server, on port 18515)
 *
 * The end that receives the bytes (WRITE and SEND: the server; READ: the client) checks the
 * first SIZE bytes after the run and prints `pt-check: N bytes checked, all as expected` or
 * what differs (exit 1). The client prints perftest's result line.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PORT "18515"
#define KEYS_LEN 108
#define DEPTH 16

static void die(const char *what)
{
	fprintf(stderr, "pt-check: %s\n", what);
	exit(2);
}

/* The pattern's byte at `i` (pattern_byte in tools/src/perf/pt_run.rs). */
static uint8_t pattern(size_t i)
{
	return (uint8_t)(i + 7 * (i >> 8) + 13 * (i >> 16) + 0xa5);
}

static int is_client;

static void full(int fd, void *buf, size_t len, int wr)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = wr ? write(fd, (char *)buf + done, len - done)
			       : read(fd, (char *)buf + done, len - done);
		if (n <= 0)
			die(wr ? "the connection failed (write)" : "the peer closed the connection");
		done += n;
	}
}

/* One exchange as perftest's: the client writes then reads, the server reads then writes. */
static void xchg(int fd, const void *mine, void *theirs, size_t len)
{
	if (is_client) {
		full(fd, (void *)mine, len, 1);
		full(fd, theirs, len, 0);
	} else {
		full(fd, theirs, len, 0);
		full(fd, (void *)mine, len, 1);
	}
}

struct keys {
	unsigned lid, out_reads, qpn, psn, rkey, srqn;
	unsigned long long vaddr;
	uint8_t gid[16];
};

static void keys_text(const struct keys *k, char *s)
{
	int n = sprintf(s, "%04x:%04x:%06x:%06x:%08x:%016llx:", k->lid, k->out_reads, k->qpn,
			k->psn, k->rkey, k->vaddr);
	for (int i = 0; i < 16; i++)
		n += sprintf(s + n, "%02x:", k->gid[i]);
	sprintf(s + n, "%08x:", k->srqn);
}

static void keys_parse(const char *s, struct keys *k)
{
	unsigned long long v[23];
	const char *p = s;

	for (int i = 0; i < 23; i++) {
		char *end;
		v[i] = strtoull(p, &end, 16);
		if (*end != ':')
			die("the peer's keys are malformed");
		p = end + 1;
	}
	k->lid = v[0], k->out_reads = v[1], k->qpn = v[2], k->psn = v[3], k->rkey = v[4];
	k->vaddr = v[5];
	for (int i = 0; i < 16; i++)
		k->gid[i] = v[6 + i];
	k->srqn = v[22];
}

static void keys(int fd, const struct keys *mine, struct keys *theirs)
{
	char out[KEYS_LEN] = {0}, in[KEYS_LEN + 1] = {0};

	keys_text(mine, out);
	xchg(fd, out, in, KEYS_LEN);
	keys_parse(in, theirs);
}

static uint64_t be64_of_double(double d)
{
	uint64_t u;

	memcpy(&u, &d, 8);
	return htobe64(u);
}

static int tcp_connect(const char *host)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
	int fd = -1;

	if (host) {
		if (getaddrinfo(host, PORT, &hints, &res))
			die("cannot resolve the host");
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen)) {
			fprintf(stderr, "Couldn't connect to %s:%s\n", host, PORT);
			exit(2);
		}
		freeaddrinfo(res);
		return fd;
	}
	hints.ai_flags = AI_PASSIVE;
	if (getaddrinfo(NULL, PORT, &hints, &res))
		die("getaddrinfo");
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (l < 0 || bind(l, res->ai_addr, res->ai_addrlen) || listen(l, 1))
		die("cannot listen on 18515");
	freeaddrinfo(res);
	fd = accept(l, NULL, NULL);
	close(l);
	if (fd < 0)
		die("accept");
	return fd;
}

/* Waits for at least `n` successful completions (60 s at most) and no more than `max`;
 * returns how many came. */
static int reap(struct ibv_cq *cq, int n, int max)
{
	struct ibv_wc wc[DEPTH];
	time_t end = time(NULL) + 60;
	int total = 0;

	while (total < n) {
		int got = ibv_poll_cq(cq, max - total < DEPTH ? max - total : DEPTH, wc);
		if (got < 0)
			die("ibv_poll_cq");
		for (int i = 0; i < got; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "pt-check: completion failed: %s\n",
					ibv_wc_status_str(wc[i].status));
				exit(2);
			}
		}
		total += got;
		if (!got && time(NULL) > end)
			die("no completion for 60 s");
	}
	return total;
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc < 4 || argc > 5) {
		fprintf(stderr, "usage: pt-check write|read|send SIZE ITERS [HOST]\n");
		return 2;
	}
	char op = argv[1][0];
	size_t size = strtoul(argv[2], NULL, 0);
	int iters = atoi(argv[3]);
	is_client = argc == 5;
	if ((op != 'w' && op != 'r' && op != 's') || !size || iters < 1 || iters > 500)
		die("bad arguments");

	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		die("no RDMA device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	if (!ctx || ibv_query_device(ctx, &da) || ibv_query_port(ctx, 1, &pa))
		die("cannot open the device");

	/* As perftest: a buffer of two halves, the keys naming the second. */
	size_t half = ((size > 4096 ? size : 4096) + 63) / 64 * 64;
	uint8_t *buf = aligned_alloc(4096, (2 * half + 4095) / 4096 * 4096);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!buf || !pd)
		die("alloc");
	/* The pattern where this end's bytes come from or the peer reads; zeros where the
	 * peer's bytes land. */
	for (size_t i = 0; i < half; i++) {
		buf[i] = (is_client && op != 'r') ? pattern(i) : 0;
		buf[half + i] = (!is_client && op == 'r') ? pattern(i) : 0;
	}
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 2 * half,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					       IBV_ACCESS_REMOTE_READ);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * 512, NULL, NULL, 0);
	struct ibv_qp_init_attr qia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = DEPTH, .max_recv_wr = 512, .max_send_sge = 1,
			.max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = mr && cq ? ibv_create_qp(pd, &qia) : NULL;
	if (!qp)
		die("cannot create the MR, CQ or QP");
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					  IBV_QP_ACCESS_FLAGS))
		die("INIT");

	/* The GID: the first IPv4-mapped entry, as perftest picks on RoCE. */
	int gidx = -1;
	union ibv_gid gid;
	for (int i = 0; i < 16 && gidx < 0; i++) {
		static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
		if (!ibv_query_gid(ctx, 1, i, &gid) && !memcmp(gid.raw, v4, 12))
			gidx = i;
	}
	if (gidx < 0)
		die("no IPv4-mapped GID");

	int fd = tcp_connect(is_client ? argv[4] : NULL);

	/* The opening: version, cycle buffer, cache line, MTU. */
	char ver[16] = "6.06", their_ver[16];
	xchg(fd, ver, their_ver, 16);
	uint32_t cb = htonl(4096), cl = htonl(64), t;
	xchg(fd, &cb, &t, 4);
	xchg(fd, &cl, &t, 4);
	char mtu[2] = {'0' + pa.active_mtu, 0}, their_mtu[2];
	xchg(fd, mtu, their_mtu, 2);
	int m = their_mtu[0] - '0';
	enum ibv_mtu path_mtu = (m >= 1 && m < (int)pa.active_mtu) ? (enum ibv_mtu)m : pa.active_mtu;

	srand48(getpid() ^ time(NULL));
	struct keys mine = {
		.out_reads = op == 'r' ? (unsigned)da.max_qp_rd_atom : 1,
		.qpn = qp->qp_num,
		.psn = lrand48() & 0xffffff,
		.rkey = mr->rkey,
		.vaddr = (uintptr_t)(buf + half),
	}, theirs, again;
	memcpy(mine.gid, gid.raw, 16);

	/* K, connect, K, K (perftest's WRITE/READ and SEND bandwidth tests alike with one QP). */
	keys(fd, &mine, &theirs);
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTR,
		.path_mtu = path_mtu,
		.dest_qp_num = theirs.qpn,
		.rq_psn = theirs.psn,
		.max_dest_rd_atomic = mine.out_reads,
		.min_rnr_timer = 12,
		.ah_attr = {.is_global = 1, .port_num = 1,
			    .grh = {.sgid_index = gidx, .hop_limit = 0xff}},
	};
	memcpy(a.ah_attr.grh.dgid.raw, theirs.gid, 16);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					  IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTS,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.sq_psn = mine.psn,
		.max_rd_atomic = theirs.out_reads ? theirs.out_reads : 1,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
	keys(fd, &mine, &again);
	keys(fd, &mine, &again);

	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = size, .lkey = mr->lkey};
	double secs = 0;
	if (op == 's') {
		if (!is_client)
			for (int i = 0; i < iters; i++) {
				struct ibv_recv_wr rw = {.sg_list = &sge, .num_sge = 1}, *bad;
				if (ibv_post_recv(qp, &rw, &bad))
					die("post_recv");
			}
		keys(fd, &mine, &again); /* the meeting before the traffic */
	}
	if (is_client) {
		double t0 = now();
		int posted = 0, done = 0;
		while (done < iters) {
			while (posted < iters && posted - done < DEPTH) {
				struct ibv_send_wr wr = {
					.sg_list = &sge,
					.num_sge = 1,
					.opcode = op == 'w' ? IBV_WR_RDMA_WRITE
						: op == 'r' ? IBV_WR_RDMA_READ : IBV_WR_SEND,
					.send_flags = IBV_SEND_SIGNALED,
					.wr.rdma = {.remote_addr = theirs.vaddr, .rkey = theirs.rkey},
				}, *bad;
				if (ibv_post_send(qp, &wr, &bad))
					die("post_send");
				posted++;
			}
			done += reap(cq, 1, posted - done);
		}
		secs = now() - t0;
	} else if (op == 's') {
		reap(cq, iters, iters);
	}

	if (op != 's') {
		/* K, the client's report (size, iters, peak, average, rate), K, done. */
		keys(fd, &mine, &again);
		double mbs = secs > 0 ? size * (double)iters / secs / 0x100000 : 0;
		uint64_t mr_out[5] = {
			htobe64(is_client ? size : 0),
			htobe64(is_client ? (uint64_t)iters : 0),
			be64_of_double(mbs),
			be64_of_double(mbs),
			be64_of_double(secs > 0 ? iters / secs / 1e6 : 0),
		}, rep[5];
		for (int i = 0; i < 5; i++)
			xchg(fd, &mr_out[i], &rep[i], 8);
		if (is_client)
			printf(" %-7zu    %-10d     %-7.2f            %-7.2f              %-7.6f\n",
			       size, iters, mbs, mbs, secs > 0 ? iters / secs / 1e6 : 0);
		else
			printf(" %-7llu    %-10llu     (the client's report)\n",
			       (unsigned long long)be64toh(rep[0]), (unsigned long long)be64toh(rep[1]));
	} else if (is_client) {
		double mbs = secs > 0 ? size * (double)iters / secs / 0x100000 : 0;
		printf(" %-7zu    %-10d     %-7.2f            %-7.2f              %-7.6f\n", size,
		       iters, mbs, mbs, iters / secs / 1e6);
	} else {
		printf(" %-7zu    %-10d     (received)\n", size, iters);
	}
	keys(fd, &mine, &again); /* the closing meeting */
	if (write(fd, "done", 5) != 5)
		die("done");
	close(fd);

	/* The check, on the end the bytes came to. */
	const uint8_t *got = NULL;
	if (op == 'r' && is_client)
		got = buf;
	else if (op == 'w' && !is_client)
		got = buf + half;
	else if (op == 's' && !is_client)
		got = buf;
	if (!got) {
		printf("pt-check: the peer checks the bytes\n");
		return 0;
	}
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < size; i++)
		if (got[i] != pattern(i) && !bad++)
			first = i;
	if (bad) {
		printf("pt-check: %zu of %zu bytes differ, the first at offset %zu (%#04x, expected "
		       "%#04x)\n", bad, size, first, got[first], pattern(first));
		return 1;
	}
	printf("pt-check: %zu bytes checked, all as expected\n", size);
	return 0;
}
