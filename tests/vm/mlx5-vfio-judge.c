/*
 * The uhca HCA model judged by rdma-core's userspace mlx5_vfio provider (issue #18, step 1):
 * open the function through vfio-pci, allocate a PD, register an MR, run DevX general
 * commands (a capability query of the whole page and of 0x810 bytes as pyverbs asks, and a
 * PAOS register read), process events, close; then open it again, which works only if
 * vfio-pci could reset the function (FLR) in between. Prints one "PASS name" or
 * "FAIL name: why" line per step; the exit status is the number of failed steps.
 *
 * Built inside the bookworm RDMA tree (gcc + libibverbs-dev) by
 * tests/vm/run-mlx5-judge-test.sh. Usage: mlx5-vfio-judge PCI_NAME (e.g. 0000:00:03.0).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

static int failed;

static void result(int ok, const char *name, const char *why)
{
	if (ok) {
		printf("PASS mlx5_vfio %s\n", name);
	} else {
		printf("FAIL mlx5_vfio %s: %s\n", name, why);
		failed++;
	}
	fflush(stdout);
}

/* Big-endian dword `i` of a command buffer. */
static uint32_t get32(const void *buf, int i)
{
	return ntohl(((const uint32_t *)buf)[i]);
}

static void set32(void *buf, int i, uint32_t v)
{
	((uint32_t *)buf)[i] = htonl(v);
}

/* QUERY_HCA_CAP (0x100) of the general capabilities (type 0, current: op_mod 1) with
 * an output of `outlen` bytes; returns the command status (0 = OK) or -errno. */
static int query_caps(struct ibv_context *ctx, size_t outlen, uint8_t *out)
{
	uint8_t in[16] = { 0 };
	int rc;

	set32(in, 0, 0x100u << 16);
	set32(in, 1, 1);
	memset(out, 0xff, outlen);
	rc = mlx5dv_devx_general_cmd(ctx, in, sizeof(in), out, outlen);
	if (rc)
		return rc < 0 ? rc : -rc;
	return out[0];
}

/* One open, the flows, close. `full`: all of them, else open + PD + close. */
static void session(struct ibv_device *dev, int round, int full)
{
	char name[64], why[160];
	struct ibv_context *ctx;
	struct ibv_pd *pd;

	snprintf(name, sizeof(name), "open (%s)", round ? "again, after a reset" : "first");
	ctx = ibv_open_device(dev);
	snprintf(why, sizeof(why), "ibv_open_device: %s", strerror(errno));
	result(ctx != NULL, name, why);
	if (!ctx)
		return;

	pd = ibv_alloc_pd(ctx);
	snprintf(name, sizeof(name), "alloc_pd (open %d)", round + 1);
	snprintf(why, sizeof(why), "ibv_alloc_pd: %s", strerror(errno));
	result(pd != NULL, name, why);

	if (full && pd) {
		size_t len = 1 << 20;
		void *buf = aligned_alloc(4096, len);
		struct ibv_mr *mr = buf ? ibv_reg_mr(pd, buf, len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				IBV_ACCESS_REMOTE_READ) : NULL;
		snprintf(why, sizeof(why), "ibv_reg_mr of 1 MiB: %s", strerror(errno));
		result(mr != NULL && mr->lkey != 0, "reg_mr 1 MiB", why);
		if (mr)
			ibv_dereg_mr(mr);
		free(buf);

		static uint8_t page[0x1010], part[0x810];
		int st = query_caps(ctx, sizeof(page), page);
		snprintf(why, sizeof(why), "status/err %d", st);
		result(st == 0, "devx QUERY_HCA_CAP (whole page)", why);
		/* cmd_hca_cap at out + 0x10: port_type [9:8] of dword 0x34/4 (1 = Ethernet). */
		snprintf(why, sizeof(why), "port_type %u", get32(page + 0x10, 0x34 / 4) >> 8 & 3);
		result(st == 0 && (get32(page + 0x10, 0x34 / 4) >> 8 & 3) == 1,
		       "caps: an Ethernet port", why);
		st = query_caps(ctx, sizeof(part), part);
		snprintf(why, sizeof(why), "status/err %d", st);
		result(st == 0 && memcmp(part + 0x10, page + 0x10, 0x800) == 0,
		       "devx QUERY_HCA_CAP with outlen 0x810 (pyverbs is_eth)", why);

		/* ACCESS_REG (0x805) read (op_mod 1) of PAOS (0x5006), local_port 1. */
		uint8_t rin[32] = { 0 }, rout[32] = { 0 };
		set32(rin, 0, 0x805u << 16);
		set32(rin, 1, 1);
		set32(rin, 2, 0x5006);
		set32(rin, 4, 1 << 16);
		st = mlx5dv_devx_general_cmd(ctx, rin, sizeof(rin), rout, sizeof(rout));
		snprintf(why, sizeof(why), "err %d status %u admin %u oper %u", st, rout[0],
			 get32(rout, 4) >> 8 & 0xf, get32(rout, 4) & 0xf);
		result(st == 0 && rout[0] == 0 && (get32(rout, 4) & 0xf) == 1,
		       "devx ACCESS_REG PAOS (port up)", why);

		st = mlx5dv_vfio_process_events(ctx);
		snprintf(why, sizeof(why), "returned %d", st);
		result(st == 0, "process_events", why);
	}
	if (pd)
		ibv_dealloc_pd(pd);
	snprintf(name, sizeof(name), "close (open %d)", round + 1);
	snprintf(why, sizeof(why), "ibv_close_device: %s", strerror(errno));
	result(ibv_close_device(ctx) == 0, name, why);
}

int main(int argc, char **argv)
{
	struct mlx5dv_vfio_context_attr attr = { 0 };
	struct ibv_device **list;

	if (argc != 2) {
		fprintf(stderr, "usage: %s PCI_NAME\n", argv[0]);
		return 2;
	}
	attr.pci_name = argv[1];
	list = mlx5dv_get_vfio_device_list(&attr);
	result(list && list[0], "get_vfio_device_list", strerror(errno));
	if (!list || !list[0])
		return failed;
	session(list[0], 0, 1);
	session(list[0], 1, 0);
	ibv_free_device_list(list);
	return failed;
}
