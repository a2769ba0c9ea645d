# Helpers that register meshtrain's tests with ctest: one executable per test, labels unit|mpi|gpu,
# multi-rank tests through CMake's MPIEXEC_* variables, GPU tests skipped (exit 77) without a device.
# SPDX-License-Identifier: MIT

# Flags every multi-rank test needs. Open MPI: run as root in CI, more ranks than cores, and yield
# when idle (oversubscribed ranks otherwise busy-poll, making 4 ranks on 2 cores ~1000x slower).
set(MT_MPIEXEC_TEST_FLAGS "")
# OpenMP workers sleep instead of spinning between parallel regions: on the shared 2-core test machines
# spinning workers of one rank steal the cores of the others (measured 20x slower training tests).
set(MT_MPI_TEST_ENV "OMP_WAIT_POLICY=passive")
# Tests that are not labelled gpu compare against CPU results: hide any GPU from them, so that on a GPU
# machine runtime.device = "auto" does not move a CPU test onto the device (gpu-labelled tests see them).
set(MT_GPU_TEST_ENV "${MT_MPI_TEST_ENV}")
list(APPEND MT_MPI_TEST_ENV "CUDA_VISIBLE_DEVICES=")
if(MT_MPI_IS_OPENMPI)
    set(MT_MPIEXEC_TEST_FLAGS --oversubscribe --allow-run-as-root --bind-to none)
    list(APPEND MT_MPI_TEST_ENV OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1)
    list(APPEND MT_GPU_TEST_ENV OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1)
endif()

# mt_add_test_exe(NAME SOURCES src... [LIBS lib...]) builds an executable for a test.
function(mt_add_test_exe name)
    cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
    add_executable(${name} ${T_SOURCES})
    target_link_libraries(${name} PRIVATE ${T_LIBS} mt_testutil)
endfunction()

# mt_add_test(NAME SOURCES src... [LIBS lib...] [LABELS l...] [TIMEOUT s]): a 1-process test.
function(mt_add_test name)
    cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
    set(env "${MT_MPI_TEST_ENV}")
    if("gpu" IN_LIST T_LABELS)
        set(env "${MT_GPU_TEST_ENV}")
    endif()
    mt_add_test_exe(${name} SOURCES ${T_SOURCES} LIBS ${T_LIBS})
    if(NOT T_LABELS)
        set(T_LABELS unit)
    endif()
    if(NOT T_TIMEOUT)
        set(T_TIMEOUT 120)
    endif()
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
                         ENVIRONMENT "${env}")
endfunction()

# mt_add_mpi_test(NAME TARGET exe NP n [ARGS a...] [LABELS l...] [TIMEOUT s]): run an existing test
# executable on n ranks through mpiexec.
function(mt_add_mpi_test name)
    cmake_parse_arguments(T "" "TARGET;NP;TIMEOUT" "ARGS;LABELS" ${ARGN})
    set(env "${MT_MPI_TEST_ENV}")
    if("gpu" IN_LIST T_LABELS)
        set(env "${MT_GPU_TEST_ENV}")
    endif()
    if(NOT T_TIMEOUT)
        set(T_TIMEOUT 180)
    endif()
    add_test(NAME ${name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_NP} ${MT_MPIEXEC_TEST_FLAGS}
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${T_TARGET}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
    set_tests_properties(${name} PROPERTIES LABELS "mpi;${T_LABELS}" TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
                         ENVIRONMENT "${env}" PROCESSORS 2)
endfunction()

# mt_add_cmd_test(NAME COMMAND cmd... [LABELS l...] [NP n] [WILL_FAIL] [PASS_REGEX re] [TIMEOUT s]):
# run a shell-level check of the meshtrain binary (optionally under mpiexec with n ranks).
function(mt_add_cmd_test name)
    cmake_parse_arguments(T "WILL_FAIL" "NP;TIMEOUT;PASS_REGEX" "COMMAND;LABELS" ${ARGN})
    set(env "${MT_MPI_TEST_ENV}")
    if("gpu" IN_LIST T_LABELS)
        set(env "${MT_GPU_TEST_ENV}")
    endif()
    if(NOT T_TIMEOUT)
        set(T_TIMEOUT 120)
    endif()
    set(cmd ${T_COMMAND})
    set(labels ${T_LABELS})
    if(T_NP)
        set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_NP} ${MT_MPIEXEC_TEST_FLAGS} ${MPIEXEC_PREFLAGS}
                ${T_COMMAND})
        list(APPEND labels mpi)
    endif()
    if(NOT labels)
        set(labels unit)
    endif()
    add_test(NAME ${name} COMMAND ${cmd})
    set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
                         ENVIRONMENT "${env}")
    if(T_WILL_FAIL)
        set_tests_properties(${name} PROPERTIES WILL_FAIL TRUE)
    endif()
    if(T_PASS_REGEX)
        set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "${T_PASS_REGEX}")
    endif()
endfunction()

# mt_add_exit_test(NAME NP n RC code REGEX re [SECONDS s] COMMAND cmd...): every one of n ranks (0: no
# launcher) must exit with code, the output must match re, and the run must end within s seconds.
function(mt_add_exit_test name)
    cmake_parse_arguments(T "" "NP;RC;REGEX;SECONDS" "COMMAND;LABELS" ${ARGN})
    set(env "${MT_MPI_TEST_ENV}")
    if("gpu" IN_LIST T_LABELS)
        set(env "${MT_GPU_TEST_ENV}")
    endif()
    if(NOT T_SECONDS)
        set(T_SECONDS 60)
    endif()
    set(labels ${T_LABELS})
    if(T_NP GREATER 0)
        list(APPEND labels mpi)
    else()
        list(APPEND labels unit)
    endif()
    add_test(NAME ${name}
             COMMAND ${CMAKE_SOURCE_DIR}/tests/expect_exit.sh ${T_NP} ${T_RC} ${T_REGEX} ${T_SECONDS}
                     ${MPIEXEC_EXECUTABLE} ${MT_MPIEXEC_TEST_FLAGS} ${MPIEXEC_PREFLAGS} -- ${T_COMMAND})
    math(EXPR timeout "${T_SECONDS} + 30")
    set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${timeout} ENVIRONMENT "${env}")
endfunction()
