/*
 * An MPI checkpoint through a Spillway mount: the multi-node Slurm test's job.
 *
 *   mpirun checkpoint INPUT INPUT_BYTES CKPT_DIR BLOCK_BYTES
 *
 * Every rank reads INPUT (staged in) and checks every byte; then writes an N-1 checkpoint
 * (CKPT_DIR/n1.ckpt, rank r's block of BLOCK_BYTES at r * BLOCK_BYTES, pwrite) and an N-N
 * checkpoint (CKPT_DIR/nn/rank-<r>.ckpt), fsyncs and closes them; after a barrier rank 0 reads
 * back the whole N-1 file and every N-N file (written on other nodes) and checks every byte.
 * Exits 0 and prints "checkpoint ok" only if every check passed.
 *
 * The byte patterns are functions of the offset (and rank), so a block written at the wrong
 * place, lost or torn shows up; the test that stages the checkpoint out computes them
 * independently (crates/cli/tests/slurm_cluster_e2e.rs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (256 * 1024)

static unsigned char input_byte(uint64_t offset) {
    return (unsigned char)((offset * 13 + 5 + (offset >> 10)) & 0xff);
}

static unsigned char n1_byte(uint64_t offset) {
    return (unsigned char)(((offset * 7) ^ (offset >> 11) ^ 0x5a) & 0xff);
}

static unsigned char nn_byte(int rank, uint64_t offset) {
    return (unsigned char)((offset * 11 + (uint64_t)rank * 29 + (offset >> 9)) & 0xff);
}

static int rank_g;

static void fail(const char *what, const char *path) {
    fprintf(stderr, "rank %d: %s %s: %s\n", rank_g, what, path, strerror(errno));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void fail_byte(const char *path, uint64_t offset, int got, int want) {
    fprintf(stderr, "rank %d: %s: byte %llu is %d, expected %d\n", rank_g, path,
            (unsigned long long)offset, got, want);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Reads [start, start + len) of path and checks it against pattern(rank, offset - base). */
static void check_file(const char *path, uint64_t start, uint64_t len, uint64_t base, int rank,
                       int kind) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        fail("opening", path);
    unsigned char *buf = malloc(CHUNK);
    for (uint64_t done = 0; done < len;) {
        size_t want = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
        ssize_t got = pread(fd, buf, want, (off_t)(start + done));
        if (got < 0)
            fail("reading", path);
        if (got == 0) {
            fprintf(stderr, "rank %d: %s: ends at %llu, expected %llu bytes\n", rank_g, path,
                    (unsigned long long)(start + done), (unsigned long long)(start + len));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (ssize_t i = 0; i < got; i++) {
            uint64_t offset = start + done + (uint64_t)i - base;
            int expected = kind == 0   ? input_byte(offset)
                           : kind == 1 ? n1_byte(offset)
                                       : nn_byte(rank, offset);
            if (buf[i] != expected)
                fail_byte(path, start + done + (uint64_t)i, buf[i], expected);
        }
        done += (uint64_t)got;
    }
    free(buf);
    close(fd);
}

/* Writes [start, start + len) of path (opened with flags) from the pattern, then fsyncs. */
static void write_file(const char *path, int flags, uint64_t start, uint64_t len, int rank,
                       int kind) {
    int fd = open(path, flags, 0644);
    if (fd < 0)
        fail("opening", path);
    unsigned char *buf = malloc(CHUNK);
    for (uint64_t done = 0; done < len;) {
        size_t n = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
        for (size_t i = 0; i < n; i++)
            buf[i] = kind == 1 ? n1_byte(start + done + i) : nn_byte(rank, done + i);
        ssize_t put = pwrite(fd, buf, n, (off_t)(start + done));
        if (put < 0)
            fail("writing", path);
        done += (uint64_t)put;
    }
    if (fsync(fd) != 0)
        fail("fsync of", path);
    if (close(fd) != 0)
        fail("closing", path);
    free(buf);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_g);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (argc != 5) {
        if (rank_g == 0)
            fprintf(stderr, "usage: %s INPUT INPUT_BYTES CKPT_DIR BLOCK_BYTES\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *input = argv[1];
    uint64_t input_bytes = strtoull(argv[2], NULL, 10);
    const char *dir = argv[3];
    if (strlen(dir) > 4096) {
        fprintf(stderr, "CKPT_DIR too long\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    uint64_t block = strtoull(argv[4], NULL, 10);
    char host[256] = "";
    gethostname(host, sizeof host - 1);

    check_file(input, 0, input_bytes, 0, rank_g, 0);
    printf("rank %d on %s: input ok (%llu bytes)\n", rank_g, host,
           (unsigned long long)input_bytes);

    char n1[4200], nndir[4200], nn[4300];
    snprintf(n1, sizeof n1, "%s/n1.ckpt", dir);
    snprintf(nndir, sizeof nndir, "%s/nn", dir);
    if (rank_g == 0) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            fail("creating", dir);
        if (mkdir(nndir, 0755) != 0 && errno != EEXIST)
            fail("creating", nndir);
        int fd = open(n1, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || close(fd) != 0)
            fail("creating", n1);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    write_file(n1, O_WRONLY, (uint64_t)rank_g * block, block, rank_g, 1);
    snprintf(nn, sizeof nn, "%s/rank-%d.ckpt", nndir, rank_g);
    write_file(nn, O_WRONLY | O_CREAT | O_TRUNC, 0, block, rank_g, 2);
    MPI_Barrier(MPI_COMM_WORLD);

    if (rank_g == 0) {
        check_file(n1, 0, (uint64_t)ranks * block, 0, 0, 1);
        struct stat st;
        if (stat(n1, &st) != 0)
            fail("stat of", n1);
        if ((uint64_t)st.st_size != (uint64_t)ranks * block) {
            fprintf(stderr, "rank 0: %s has %lld bytes, expected %llu\n", n1,
                    (long long)st.st_size, (unsigned long long)ranks * block);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (int r = 0; r < ranks; r++) {
            snprintf(nn, sizeof nn, "%s/rank-%d.ckpt", nndir, r);
            check_file(nn, 0, block, 0, r, 2);
        }
        printf("checkpoint ok: %d ranks, N-1 %llu bytes, N-N %d x %llu bytes\n", ranks,
               (unsigned long long)ranks * block, ranks, (unsigned long long)block);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
