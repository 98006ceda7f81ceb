# attn_core's link dependencies, the one place to change them. CMakeLists.txt includes this file to build,
# the installed attnConfig.cmake includes it again to find them for its users (find_dependency), and
# attn.pc lists the same pkg-config modules. Not the dependencies of the tests, benchmarks, CLI or module.
#
# ATTN_DEP_PACKAGES    CMake packages (find_package names), and ATTN_DEP_TARGETS the targets they give.
# ATTN_DEP_PKGCONFIG   pkg-config modules; each becomes the imported target PkgConfig::attn_<module>.
# ATTN_DEP_PC_LIBS     what attn.pc adds to Libs for the CMake packages (no .pc file of their own).
# ATTN_DEP_PC_CFLAGS   what attn.pc adds to Cflags: the definitions attn::attn carries as a CMake target.
set(ATTN_DEP_PACKAGES nlohmann_json Threads)
set(ATTN_DEP_TARGETS nlohmann_json::nlohmann_json Threads::Threads)
set(ATTN_DEP_PKGCONFIG libhwy cairo libutf8proc libpcre2-8)
set(ATTN_DEP_PC_LIBS "-pthread")
set(ATTN_DEP_PC_REQUIRES "nlohmann_json")  # nlohmann-json3-dev ships nlohmann_json.pc
set(ATTN_DEP_PC_CFLAGS "")
if(ATTN_HAVE_MPI)  # set by CMakeLists.txt, and by attnConfig.cmake as it was at build time
  set(MPI_CXX_SKIP_MPICXX ON)  # MPI::MPI_CXX then defines OMPI_SKIP_MPICXX; ompi.pc does not
  set(ATTN_DEP_PC_CFLAGS "-DATTN_HAVE_MPI -DOMPI_SKIP_MPICXX")
  list(APPEND ATTN_DEP_PACKAGES MPI)
  list(APPEND ATTN_DEP_TARGETS MPI::MPI_CXX)
  string(APPEND ATTN_DEP_PC_REQUIRES " ompi")
endif()

# Finds them all and appends the pkg-config targets to ATTN_DEP_TARGETS. Inside a package config
# (CMAKE_FIND_PACKAGE_NAME is set) a miss makes find_package(attn) fail and say which one, instead of
# stopping the user's configure.
macro(attn_find_dependencies)
  if(CMAKE_FIND_PACKAGE_NAME)
    include(CMakeFindDependencyMacro)
    foreach(_attn_dep IN LISTS ATTN_DEP_PACKAGES)
      find_dependency(${_attn_dep})
    endforeach()
    find_dependency(PkgConfig)
  else()
    foreach(_attn_dep IN LISTS ATTN_DEP_PACKAGES)
      find_package(${_attn_dep} REQUIRED)
    endforeach()
    find_package(PkgConfig REQUIRED)
  endif()
  foreach(_attn_dep IN LISTS ATTN_DEP_PKGCONFIG)
    if(NOT TARGET PkgConfig::attn_${_attn_dep})
      pkg_check_modules(attn_${_attn_dep} QUIET IMPORTED_TARGET GLOBAL ${_attn_dep})
    endif()
    if(NOT TARGET PkgConfig::attn_${_attn_dep})
      set(_attn_msg "attn needs the pkg-config module '${_attn_dep}' (see scripts/install-deps.sh)")
      if(CMAKE_FIND_PACKAGE_NAME)
        set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE "${_attn_msg}")
        set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
        return()
      endif()
      message(FATAL_ERROR "${_attn_msg}")
    endif()
    list(APPEND ATTN_DEP_TARGETS PkgConfig::attn_${_attn_dep})
  endforeach()
endmacro()
