// Where a tensor's storage lives: host memory, or the memory of a compute device as its backend
// provides it (ops/backend.h: alloc, free, copy, memset, and optionally reserve/commit/decommit).
// Core knows no device; a Storage made with a DeviceMemory allocates through it.
#pragma once
#include <cstddef>

namespace titan {

// A device's memory functions; all null (the default) means host memory.
struct DeviceMemory {
  void* (*alloc)(size_t bytes) = nullptr;  // uninitialized, at least 64-byte aligned
  void (*free)(void* p) = nullptr;
  void (*copy)(void* dst, const void* src, size_t bytes) = nullptr;  // either side host or device
  void (*memset)(void* dst, int value, size_t bytes) = nullptr;
  // Optional, all three or none: memory given back and taken again in place, a granule (the
  // device's mapping unit) at a time, as FSDP reshards a unit of a flat buffer (what madvise does
  // for host pages, except that a granule given back must be committed before it is touched).
  // reserve: an address range of at least `bytes`, 64-byte aligned, with no memory behind it
  //          (freed with free);
  // commit:  memory behind every granule that [p, p+bytes) touches and lacks it, zeroed;
  // decommit: zeroes [p, p+bytes) where memory is behind it and gives back the granules wholly
  //          inside it.
  void* (*reserve)(size_t bytes) = nullptr;
  void (*commit)(void* p, size_t bytes) = nullptr;
  void (*decommit)(void* p, size_t bytes) = nullptr;
  bool host() const { return alloc == nullptr; }
};

}  // namespace titan
