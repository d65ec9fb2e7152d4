print("harbor")
