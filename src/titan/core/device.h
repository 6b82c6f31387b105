// Where a tensor's storage lives: host memory, or the memory of a compute device as its backend
// provides it (ops/backend.h: alloc, free, copy, memset). Core knows no device; a Storage made
// with a DeviceMemory allocates through it.
#pragma once
#include <cstddef>

namespace titan {

// A device's memory functions; all null (the default) means host memory.
struct DeviceMemory {
  void* (*alloc)(size_t bytes) = nullptr;  // uninitialized, at least 64-byte aligned
  void (*free)(void* p) = nullptr;
  void (*copy)(void* dst, const void* src, size_t bytes) = nullptr;  // either side host or device
  void (*memset)(void* dst, int value, size_t bytes) = nullptr;
  bool host() const { return alloc == nullptr; }
};

}  // namespace titan
