# Writes the bytes of INPUT to OUTPUT as a comma-separated list of hex literals, to be included inside an array
# initializer: `constexpr unsigned char bytes[] = {\n#include "OUTPUT"\n};`.
# Usage: cmake -DINPUT=FILE -DOUTPUT=FILE -P embed.cmake
if(NOT INPUT OR NOT OUTPUT)
  message(FATAL_ERROR "embed.cmake: pass -DINPUT=FILE -DOUTPUT=FILE")
endif()
file(READ "${INPUT}" hex HEX)
if(hex STREQUAL "")
  message(FATAL_ERROR "embed.cmake: ${INPUT} is empty")
endif()
# Sixteen bytes (32 hex digits) to a line, so the file stays readable.
string(REGEX REPLACE "(................................)" "\\1\n" hex "${hex}")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}" "${bytes}\n")
