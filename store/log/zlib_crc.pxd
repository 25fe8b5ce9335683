# zlib C API declarations for the compiled build of store/log/record.py (CRC32 of a record in place).
cdef extern from "zlib.h":
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len) nogil
