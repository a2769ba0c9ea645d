/* CRC32C (Castagnoli, the iSCSI / ext4 / gRPC checksum): checkpoints record one per shard piece so a
 * corrupted or truncated file is caught before a single value is trusted. SSE4.2's crc32 instruction
 * when the CPU has it, a table otherwise; both give the same result.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CRC32C_H
#define MT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Continues a CRC32C over n bytes at p: start with crc = 0, feed the pieces in order; the result of
 * feeding "123456789" from 0 is 0xE3069283 (the standard check value). */
uint32_t mt_crc32c(uint32_t crc, const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
