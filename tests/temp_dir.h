// temp_dir.h — a private directory under the system temp dir for tests that write files,
// removed with everything in it when the test ends.
#ifndef ATTNRES_TEMP_DIR_H
#define ATTNRES_TEMP_DIR_H

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

struct TempDir {
    std::string path;
    TempDir() {
        namespace fs = std::filesystem;
        std::string pattern = (fs::temp_directory_path() / "attnres_test_XXXXXX").string();
        std::vector<char> buffer(pattern.begin(), pattern.end());
        buffer.push_back('\0');
        REQUIRE(mkdtemp(buffer.data()) != nullptr);
        path = buffer.data();
    }
    ~TempDir() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string file(const std::string& name) const { return path + "/" + name; }
};

#endif
