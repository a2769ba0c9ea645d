# Writes a C source defining `const char NAME[]` with the contents of INPUT (run with cmake -P).
file(READ "${INPUT}" content)
string(REPLACE "\\" "\\\\" content "${content}")
string(REPLACE "\"" "\\\"" content "${content}")
string(REPLACE "\n" "\\n\"\n\"" content "${content}")
file(WRITE "${OUTPUT}.tmp" "/* Generated from ${INPUT} by cmake/EmbedText.cmake. */\nconst char ${NAME}[] = \"${content}\";\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
