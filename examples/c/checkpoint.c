/*
 * checkpoint.c — a C application checkpointing through libspillway.
 *
 * Plays an MPI-like job of RANKS ranks (one thread and one Spillway client each) that writes an
 * N-N checkpoint (a file per rank) or an N-1 checkpoint (disjoint ranges of one shared file),
 * commits it, then restarts like a new job would: lists the epochs, opens every file, reads it
 * back and verifies every byte. Prints one line per step; exits non-zero on any failure or
 * mismatch.
 *
 *   checkpoint [--mode nn|n1] [--placement striped|local] [--durability ssd|memory]
 *              [--ranks N] [--bytes-per-rank B] [--transfer-bytes T] [--epoch E] [--delete]
 *              ENDPOINT...
 *
 * Build: cc -std=c11 -Wall -Wextra -pthread checkpoint.c $(pkg-config --cflags --libs spillway)
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spillway.h"

#define RANKS_MAX 64

struct settings {
    int n_to_1;
    uint32_t placement;
    uint32_t durability;
    uint32_t ranks;
    uint64_t bytes_per_rank;
    uint64_t transfer_bytes;
    uint64_t epoch;
    int delete_after;
    const char *const *endpoints;
    size_t endpoint_count;
};

struct rank_job {
    const struct settings *settings;
    uint32_t rank;
    pthread_barrier_t *barrier;
    int failed;
};

/* The byte a rank writes at `offset` of its file: a hash, so misplaced bytes are caught. */
static uint8_t pattern_byte(uint64_t epoch, uint32_t rank, uint64_t offset) {
    uint64_t x = (epoch << 40) ^ ((uint64_t)rank << 32) ^ (offset >> 3);
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (uint8_t)(x >> (8 * (offset & 7)));
}

static void file_name(const struct settings *s, uint32_t rank, char *out, size_t out_bytes) {
    if (s->n_to_1) {
        snprintf(out, out_bytes, "checkpoint/shared");
    } else {
        snprintf(out, out_bytes, "checkpoint/rank%04" PRIu32, rank);
    }
}

/* Where rank `rank`'s bytes start in its file. */
static uint64_t rank_offset(const struct settings *s, uint32_t rank) {
    return s->n_to_1 ? (uint64_t)rank * s->bytes_per_rank : 0;
}

static int report(const char *step, uint32_t rank, int status) {
    fprintf(stderr, "FAIL %s (rank %" PRIu32 "): %s (errno %d: %s)\n", step, rank, spillway_last_error_message(), -status,
            strerror(-status));
    return 1;
}

static int connect_client(const struct settings *s, uint32_t rank, spillway_client **client) {
    spillway_options options;
    int status = spillway_options_init(&options);
    if (status != 0) {
        return status;
    }
    options.placement = s->placement;
    options.rank = rank;
    options.durability = s->durability;
    return spillway_connect(s->endpoints, s->endpoint_count, &options, client);
}

static void *rank_main(void *argument) {
    struct rank_job *job = argument;
    const struct settings *s = job->settings;
    spillway_client *client = NULL;
    spillway_file *file = NULL;
    uint8_t *buffer = malloc(s->transfer_bytes);
    char name[128];
    int status;

    file_name(s, job->rank, name, sizeof name);
    if (buffer == NULL) {
        fprintf(stderr, "FAIL rank %" PRIu32 ": out of memory\n", job->rank);
        job->failed = 1;
    }
    if (!job->failed && (status = connect_client(s, job->rank, &client)) != 0) {
        job->failed = report("connect", job->rank, status);
    }
    if (!job->failed && (status = spillway_begin_epoch(client, s->epoch)) != 0) {
        job->failed = report("begin_epoch", job->rank, status);
    }
    if (!job->failed && (status = spillway_create_file(client, s->epoch, name, &file)) != 0) {
        job->failed = report("create_file", job->rank, status);
    }
    uint64_t base = rank_offset(s, job->rank);
    for (uint64_t done = 0; !job->failed && done < s->bytes_per_rank;) {
        uint64_t length = s->bytes_per_rank - done < s->transfer_bytes ? s->bytes_per_rank - done : s->transfer_bytes;
        for (uint64_t i = 0; i < length; i++) {
            buffer[i] = pattern_byte(s->epoch, job->rank, base + done + i);
        }
        if ((status = spillway_write(client, file, base + done, buffer, (size_t)length)) != 0) {
            job->failed = report("write", job->rank, status);
        }
        done += length;
    }
    if (!job->failed && (status = spillway_flush(client)) != 0) {
        job->failed = report("flush", job->rank, status);
    }
    /* Every rank reaches the barrier, failed or not, so that nobody waits forever. */
    pthread_barrier_wait(job->barrier);
    if (!job->failed && (status = spillway_commit_epoch(client, s->epoch)) != 0) {
        job->failed = report("commit_epoch", job->rank, status);
    }
    spillway_file_close(file);
    spillway_disconnect(client);
    free(buffer);
    return NULL;
}

struct file_count {
    size_t files;
    uint64_t bytes_max;
};

static int count_file(const char *name, uint64_t size_bytes, void *context) {
    struct file_count *count = context;
    (void)name;
    count->files++;
    if (size_bytes > count->bytes_max) {
        count->bytes_max = size_bytes;
    }
    return 0;
}

/* Restart: a fresh client finds the epoch, opens every file and checks every byte. */
static int restart_and_verify(const struct settings *s) {
    spillway_client *client = NULL;
    int status = connect_client(s, 0, &client);
    if (status != 0) {
        return report("restart connect", 0, status);
    }
    int failed = 0;
    spillway_epoch_info epochs[16];
    size_t epoch_count = 0;
    if ((status = spillway_list_epochs(client, epochs, 16, &epoch_count)) != 0) {
        failed = report("list_epochs", 0, status);
    }
    int found = 0;
    for (size_t i = 0; !failed && i < epoch_count && i < 16; i++) {
        if (epochs[i].epoch == s->epoch) {
            found = 1;
            uint32_t wanted = s->durability == SPILLWAY_DURABILITY_MEMORY ? SPILLWAY_EPOCH_COMMITTED_MEMORY : SPILLWAY_EPOCH_COMMITTED;
            printf("list_epochs: epoch %" PRIu64 " state %" PRIu32 " on %" PRIu32 " server(s), %" PRIu64 " bytes\n", epochs[i].epoch,
                   epochs[i].state, epochs[i].servers, epochs[i].bytes);
            if (epochs[i].state < wanted || epochs[i].state == SPILLWAY_EPOCH_OPEN) {
                fprintf(stderr, "FAIL list_epochs: epoch %" PRIu64 " is in state %" PRIu32 ", expected at least %" PRIu32 "\n", s->epoch,
                        epochs[i].state, wanted);
                failed = 1;
            }
        }
    }
    if (!failed && !found) {
        fprintf(stderr, "FAIL list_epochs: epoch %" PRIu64 " is missing (%zu epochs listed)\n", s->epoch, epoch_count);
        failed = 1;
    }
    struct file_count count = {0, 0};
    if (!failed && (status = spillway_list_files(client, s->epoch, count_file, &count)) != 0) {
        failed = report("list_files", 0, status);
    }
    size_t files_expected = s->n_to_1 ? 1 : s->ranks;
    if (!failed) {
        printf("list_files: %zu file(s), largest %" PRIu64 " bytes\n", count.files, count.bytes_max);
        if (count.files != files_expected) {
            fprintf(stderr, "FAIL list_files: %zu files, expected %zu\n", count.files, files_expected);
            failed = 1;
        }
    }
    uint8_t *buffer = malloc(s->bytes_per_rank ? s->bytes_per_rank : 1);
    if (buffer == NULL) {
        fprintf(stderr, "FAIL restart: out of memory\n");
        failed = 1;
    }
    uint64_t verified = 0;
    for (uint32_t rank = 0; !failed && rank < s->ranks; rank++) {
        char name[128];
        spillway_file *file = NULL;
        file_name(s, rank, name, sizeof name);
        if ((status = spillway_open_file(client, s->epoch, name, &file)) != 0) {
            failed = report("open_file", rank, status);
            break;
        }
        uint64_t size = 0;
        uint64_t size_expected = s->n_to_1 ? (uint64_t)s->ranks * s->bytes_per_rank : s->bytes_per_rank;
        if ((status = spillway_file_size(client, file, &size)) != 0) {
            failed = report("file_size", rank, status);
        } else if (size != size_expected) {
            fprintf(stderr, "FAIL file_size: %s is %" PRIu64 " bytes, expected %" PRIu64 "\n", name, size, size_expected);
            failed = 1;
        }
        uint64_t base = rank_offset(s, rank);
        if (!failed && (status = spillway_read(client, file, base, buffer, (size_t)s->bytes_per_rank)) != 0) {
            failed = report("read", rank, status);
        }
        for (uint64_t i = 0; !failed && i < s->bytes_per_rank; i++) {
            uint8_t expected = pattern_byte(s->epoch, rank, base + i);
            if (buffer[i] != expected) {
                fprintf(stderr, "FAIL verify: %s byte %" PRIu64 " is 0x%02x, expected 0x%02x (rank %" PRIu32 ")\n", name, base + i,
                        buffer[i], expected, rank);
                failed = 1;
            }
        }
        verified += failed ? 0 : s->bytes_per_rank;
        spillway_file_close(file);
    }
    if (!failed) {
        printf("read+verify: %" PRIu64 " bytes from %" PRIu32 " rank(s) match\n", verified, s->ranks);
    }
    /* Restarting from a file that was never written must say ENOENT, not crash or succeed. */
    spillway_file *missing = NULL;
    if (!failed) {
        status = spillway_open_file(client, s->epoch, "checkpoint/never-written", &missing);
        if (status != -ENOENT || missing != NULL) {
            fprintf(stderr, "FAIL open missing file: got %d, expected %d (-ENOENT)\n", status, -ENOENT);
            failed = 1;
        } else {
            printf("open missing file: -ENOENT (%s)\n", spillway_last_error_message());
        }
    }
    if (!failed && s->delete_after) {
        if ((status = spillway_delete_epoch(client, s->epoch)) != 0) {
            failed = report("delete_epoch", 0, status);
        } else if ((status = spillway_list_epochs(client, epochs, 16, &epoch_count)) != 0) {
            failed = report("list_epochs after delete", 0, status);
        } else {
            for (size_t i = 0; i < epoch_count && i < 16; i++) {
                if (epochs[i].epoch == s->epoch) {
                    fprintf(stderr, "FAIL delete_epoch: epoch %" PRIu64 " still listed\n", s->epoch);
                    failed = 1;
                }
            }
            if (!failed) {
                printf("delete_epoch: epoch %" PRIu64 " gone\n", s->epoch);
            }
        }
    }
    free(buffer);
    spillway_disconnect(client);
    return failed;
}

static int parse_u64(const char *text, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') {
        return -1;
    }
    *out = value;
    return 0;
}

static int usage(const char *program) {
    fprintf(stderr,
            "usage: %s [--mode nn|n1] [--placement striped|local] [--durability ssd|memory] [--ranks N]\n"
            "          [--bytes-per-rank B] [--transfer-bytes T] [--epoch E] [--delete] ENDPOINT...\n",
            program);
    return 2;
}

int main(int argc, char **argv) {
    struct settings s = {0, SPILLWAY_PLACEMENT_STRIPED, SPILLWAY_DURABILITY_SSD, 4, 1 << 20, 256 << 10, 1, 0, NULL, 0};
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        const char *flag = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t number = 0;
        if (strcmp(flag, "--delete") == 0) {
            s.delete_after = 1;
            continue;
        }
        if (value == NULL) {
            return usage(argv[0]);
        }
        i++;
        if (strcmp(flag, "--mode") == 0 && (strcmp(value, "nn") == 0 || strcmp(value, "n1") == 0)) {
            s.n_to_1 = strcmp(value, "n1") == 0;
        } else if (strcmp(flag, "--placement") == 0 && (strcmp(value, "striped") == 0 || strcmp(value, "local") == 0)) {
            s.placement = strcmp(value, "local") == 0 ? SPILLWAY_PLACEMENT_LOCAL : SPILLWAY_PLACEMENT_STRIPED;
        } else if (strcmp(flag, "--durability") == 0 && (strcmp(value, "ssd") == 0 || strcmp(value, "memory") == 0)) {
            s.durability = strcmp(value, "memory") == 0 ? SPILLWAY_DURABILITY_MEMORY : SPILLWAY_DURABILITY_SSD;
        } else if (strcmp(flag, "--ranks") == 0 && parse_u64(value, &number) == 0 && number > 0 && number <= RANKS_MAX) {
            s.ranks = (uint32_t)number;
        } else if (strcmp(flag, "--bytes-per-rank") == 0 && parse_u64(value, &number) == 0 && number > 0) {
            s.bytes_per_rank = number;
        } else if (strcmp(flag, "--transfer-bytes") == 0 && parse_u64(value, &number) == 0 && number > 0) {
            s.transfer_bytes = number;
        } else if (strcmp(flag, "--epoch") == 0 && parse_u64(value, &number) == 0) {
            s.epoch = number;
        } else {
            fprintf(stderr, "bad flag or value: %s %s\n", flag, value);
            return usage(argv[0]);
        }
    }
    if (i >= argc) {
        return usage(argv[0]);
    }
    s.endpoints = (const char *const *)&argv[i];
    s.endpoint_count = (size_t)(argc - i);
    printf("libspillway %s: %s checkpoint, %" PRIu32 " rank(s) x %" PRIu64 " bytes, epoch %" PRIu64 ", %zu server(s)\n",
           spillway_version(), s.n_to_1 ? "N-1" : "N-N", s.ranks, s.bytes_per_rank, s.epoch, s.endpoint_count);

    spillway_client *probe = NULL;
    int status = connect_client(&s, 0, &probe);
    if (status != 0) {
        return report("connect", 0, status);
    }
    spillway_server_status servers[8];
    size_t server_count = 0;
    if ((status = spillway_status(probe, servers, 8, &server_count)) != 0) {
        spillway_disconnect(probe);
        return report("status", 0, status);
    }
    printf("connect: %d server(s), first is \"%s\" with %" PRIu64 " DRAM bytes\n", spillway_server_count(probe), servers[0].server_name,
           servers[0].dram_bytes_max);
    spillway_disconnect(probe);

    pthread_t threads[RANKS_MAX];
    struct rank_job jobs[RANKS_MAX];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, s.ranks);
    for (uint32_t rank = 0; rank < s.ranks; rank++) {
        jobs[rank] = (struct rank_job){&s, rank, &barrier, 0};
        if (pthread_create(&threads[rank], NULL, rank_main, &jobs[rank]) != 0) {
            fprintf(stderr, "FAIL: cannot start rank %" PRIu32 "\n", rank);
            return 1;
        }
    }
    int failed = 0;
    for (uint32_t rank = 0; rank < s.ranks; rank++) {
        pthread_join(threads[rank], NULL);
        failed |= jobs[rank].failed;
    }
    pthread_barrier_destroy(&barrier);
    if (failed) {
        return 1;
    }
    printf("write+commit: %" PRIu32 " rank(s) wrote and committed %" PRIu64 " bytes\n", s.ranks, (uint64_t)s.ranks * s.bytes_per_rank);
    if (restart_and_verify(&s) != 0) {
        return 1;
    }
    printf("OK\n");
    return 0;
}
