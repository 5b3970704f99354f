// Placeholder; filled below.
namespace kplan::moe {}
